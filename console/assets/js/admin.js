// Admin: API keys, members and roles, webhook endpoints with their
// deliveries and attempts, usage with the invoice preview, and limits.
// Each tab asks for what it shows; a tab the viewer may not use is absent.

import { gql } from './api.js';
import { h, clear, errorBox, fmtTime, table, empty, ask, toast, showOnce, shortId, fail } from './ui.js';

const SCOPES = ['runs:read', 'runs:write', 'workflows:read', 'workflows:write', 'keys:manage', 'members:manage', 'webhooks:manage',
  'billing:read', 'worker', 'events:write', 'secrets:manage', 'secrets:outputs', 'admin'];
const ROLES = ['OWNER', 'ADMIN', 'DEVELOPER', 'VIEWER'];
const TABS = [['keys', 'API keys', 'keys:manage'], ['members', 'Members', 'members:manage'], ['webhooks', 'Webhooks', 'webhooks:manage'], ['usage', 'Usage and limits', null]];

export async function page(main, ctx, tab) {
  const tabs = TABS.filter(([, , p]) => !p || ctx.can(p));
  main.append(h('h1', null, 'Admin'), h('nav', { class: 'tabs', 'aria-label': 'Admin sections' }, tabs.map(([id, label]) =>
    h('a', { href: '/admin/' + id, 'aria-current': id === tab ? 'page' : null }, label))));
  const body = h('div', { class: 'tab-body' });
  main.append(body);
  if (!tabs.some(([id]) => id === tab)) { body.append(errorBox({ code: 'FORBIDDEN', message: 'You may not manage this.' })); return; }
  await { keys, members, webhooks, usage }[tab](body, ctx);
}

async function keys(body, ctx) {
  const d = await gql(`{ apiKeys(first: 500) { id keyId name scopes createdBy createdAt expiresAt revokedAt lastUsedAt } }`);
  const live = d.apiKeys.filter((k) => !k.revokedAt);
  body.append(h('div', { class: 'page-head' }, h('h2', null, `API keys (${live.length} live)`),
    h('button', { class: 'btn primary', id: 'create-key', onclick: async () => {
      const v = await ask({ title: 'Create an API key', confirm: 'Create', fields: [
        { name: 'name', label: 'Name', required: true },
        { name: 'scopes', label: 'Scopes', type: 'checkboxes', options: SCOPES, value: ['runs:read'] },
        { name: 'expires', label: 'Expires (optional)', type: 'datetime-local' }] });
      if (!v) return;
      try {
        const r = await gql(`mutation($in: CreateApiKeyInput!) { createApiKey(input: $in) { secret apiKey { id } } }`,
          { in: { name: v.name, scopes: v.scopes, expiresAt: v.expires ? new Date(v.expires).toISOString() : null } });
        showOnce('Your new API key', r.createApiKey.secret);
        reload(body, ctx, keys);
      } catch (e) { fail(e); }
    } }, 'Create key')),
  d.apiKeys.length ? h('div', { class: 'card flush' }, table(['Name', 'Key id', 'Scopes', 'Created', 'Last used', 'Expires', ''], d.apiKeys.map((k) => h('tr', { class: k.revokedAt ? 'revoked' : '' },
    h('td', null, k.name), h('td', { class: 'mono' }, k.keyId), h('td', null, k.scopes.map((x) => h('span', { class: 'tag' }, x))),
    h('td', null, fmtTime(k.createdAt), h('div', { class: 'muted small' }, k.createdBy)), h('td', null, fmtTime(k.lastUsedAt)), h('td', null, fmtTime(k.expiresAt)),
    h('td', null, k.revokedAt ? h('span', { class: 'muted' }, 'revoked ' + fmtTime(k.revokedAt)) : h('button', { class: 'btn small danger', dataset: { revoke: k.id }, onclick: async () => {
      if (!(await ask({ title: `Revoke “${k.name}”?`, body: 'Programs using it stop at once. This cannot be undone.', danger: true, confirm: 'Revoke' }))) return;
      try { await gql(`mutation($id: ID!) { revokeApiKey(id: $id) { id } }`, { id: k.id }); toast('Key revoked.'); reload(body, ctx, keys); } catch (e) { fail(e); }
    } }, 'Revoke')))), { caption: 'API keys' })) : empty('No API keys.'));
}

function reload(body, ctx, fn) { clear(body); fn(body, ctx).catch((e) => body.append(errorBox(e))); }

async function members(body, ctx) {
  const d = await gql(`{ members { subject role email createdAt } }`);
  const me = ctx.viewer.subject;
  const roleSel = (m) => {
    const sel = h('select', { 'aria-label': `Role of ${m.subject}` }, ROLES.map((r) => h('option', { value: r }, r.toLowerCase())));
    sel.value = m.role;
    sel.addEventListener('change', async () => {
      if (!(await ask({ title: `Make ${m.subject} ${sel.value.toLowerCase()}?`, confirm: 'Change role' }))) { sel.value = m.role; return; }
      try { await gql(`mutation($s: String!, $r: Role!) { changeMemberRole(subject: $s, role: $r) { role } }`, { s: m.subject, r: sel.value }); toast('Role changed.'); reload(body, ctx, members); }
      catch (e) { sel.value = m.role; fail(e); }
    });
    return sel;
  };
  body.append(h('div', { class: 'page-head' }, h('h2', null, `Members (${d.members.length})`),
    h('button', { class: 'btn primary', id: 'add-member', onclick: async () => {
      const v = await ask({ title: 'Add a member', confirm: 'Add', fields: [
        { name: 'subject', label: 'Subject (the user id their tokens carry)', required: true },
        { name: 'email', label: 'Email (optional)', type: 'email' },
        { name: 'role', label: 'Role', type: 'select', options: ROLES.map((r) => ({ value: r, label: r.toLowerCase() })) }] });
      if (!v) return;
      try { await gql(`mutation($s: String!, $r: Role!, $e: String) { addMember(subject: $s, role: $r, email: $e) { subject } }`, { s: v.subject, r: v.role, e: v.email || null }); toast('Member added.'); reload(body, ctx, members); }
      catch (e) { fail(e); }
    } }, 'Add member')),
  h('div', { class: 'card flush' }, table(['Subject', 'Email', 'Role', 'Since', ''], d.members.map((m) => h('tr', null,
    h('td', null, m.subject, m.subject === me ? [' ', h('span', { class: 'tag' }, 'you')] : null), h('td', null, m.email || '—'), h('td', null, roleSel(m)), h('td', null, fmtTime(m.createdAt)),
    h('td', null, h('button', { class: 'btn small danger', onclick: async () => {
      if (!(await ask({ title: `Remove ${m.subject}?`, body: 'Their tokens stop working at once.', danger: true, confirm: 'Remove' }))) return;
      try { await gql(`mutation($s: String!) { removeMember(subject: $s) }`, { s: m.subject }); toast('Member removed.'); reload(body, ctx, members); } catch (e) { fail(e); }
    } }, 'Remove')))), { caption: 'Members' })));
}

const EVENTS = ['run.completed', 'run.failed', 'run.cancelled'];

async function webhooks(body, ctx) {
  const d = await gql(`{ webhookEndpoints { id url description eventTypes enabled disabledReason failingSince lastSuccessAt createdAt secrets { id createdAt expiresAt } } }`);
  const deliveries = h('div', { id: 'deliveries' });
  body.append(h('div', { class: 'page-head' }, h('h2', null, `Webhook endpoints (${d.webhookEndpoints.length})`),
    h('button', { class: 'btn primary', id: 'add-endpoint', onclick: async () => {
      const v = await ask({ title: 'Add a webhook endpoint', confirm: 'Add', fields: [
        { name: 'url', label: 'URL', type: 'url', required: true, placeholder: 'https://example.com/hooks/composer' },
        { name: 'description', label: 'Description (optional)' },
        { name: 'events', label: 'Events', type: 'checkboxes', options: EVENTS, value: EVENTS }] });
      if (!v) return;
      try {
        const r = await gql(`mutation($in: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $in) { secret endpoint { id } } }`,
          { in: { url: v.url, description: v.description || null, eventTypes: v.events } });
        showOnce('The endpoint\u2019s signing secret', r.createWebhookEndpoint.secret);
        reload(body, ctx, webhooks);
      } catch (e) { fail(e); }
    } }, 'Add endpoint')));
  const act = (label, fn, cls = '') => h('button', { class: 'btn small ' + cls, onclick: fn }, label);
  const run = async (q, vars, msg) => { try { const r = await gql(q, vars); toast(msg); return r; } catch (e) { fail(e); return null; } };
  if (!d.webhookEndpoints.length) body.append(empty('No endpoints.'));
  for (const ep of d.webhookEndpoints) {
    body.append(h('section', { class: 'card endpoint', dataset: { endpoint: ep.id }, 'aria-label': ep.url },
      h('div', { class: 'card-head' },
        h('div', null, h('h3', { class: 'mono' }, ep.url), h('p', { class: 'muted small' }, ep.description || '', ep.eventTypes.map((x) => h('span', { class: 'tag' }, x)))),
        h('div', null, ep.enabled ? h('span', { class: 'badge st-completed' }, 'enabled') : h('span', { class: 'badge st-failed', title: ep.disabledReason || '' }, 'disabled'))),
      h('dl', { class: 'kv inline' },
        h('dt', null, 'Last success'), h('dd', null, fmtTime(ep.lastSuccessAt)),
        h('dt', null, 'Failing since'), h('dd', null, fmtTime(ep.failingSince)),
        h('dt', null, 'Secrets'), h('dd', null, ep.secrets.map((sct) => h('span', { class: 'tag' }, sct.expiresAt ? `rotated out ${fmtTime(sct.expiresAt)}` : 'current')))),
      h('div', { class: 'actions' },
        act('Deliveries', () => showDeliveries(deliveries, ep)),
        act('Send test ping', async () => { if (await run(`mutation($id: ID!) { sendWebhookTestPing(endpointId: $id) { id } }`, { id: ep.id }, 'Test ping queued.')) showDeliveries(deliveries, ep); }),
        act('Rotate secret…', async () => {
          const v = await ask({ title: 'Rotate the signing secret?', body: 'The old secret keeps signing alongside the new one during the grace period.', confirm: 'Rotate',
            fields: [{ name: 'grace', label: 'Grace period in hours (default 24, at most 168)', type: 'number', value: '24' }] });
          if (!v) return;
          const r = await run(`mutation($id: ID!, $g: Int) { rotateWebhookSecret(id: $id, graceSeconds: $g) { secret } }`, { id: ep.id, g: Math.round(parseFloat(v.grace || '24') * 3600) }, 'Secret rotated.');
          if (r) { showOnce('The new signing secret', r.rotateWebhookSecret.secret); reload(body, ctx, webhooks); }
        }),
        ep.enabled ? act('Disable', async () => { if (await ask({ title: 'Disable this endpoint?', body: 'Deliveries wait until it is enabled again.', confirm: 'Disable', danger: true })) { await run(`mutation($id: ID!) { disableWebhookEndpoint(id: $id) { id } }`, { id: ep.id }, 'Disabled.'); reload(body, ctx, webhooks); } })
          : act('Enable', async () => { await run(`mutation($id: ID!) { updateWebhookEndpoint(id: $id, input: {enabled: true}) { id } }`, { id: ep.id }, 'Enabled.'); reload(body, ctx, webhooks); }),
        act('Delete', async () => { if (await ask({ title: 'Delete this endpoint?', body: 'Its secrets and delivery history are deleted too.', confirm: 'Delete', danger: true })) { await run(`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: ep.id }, 'Deleted.'); reload(body, ctx, webhooks); } }, 'danger'))));
  }
  body.append(deliveries);
  if (d.webhookEndpoints.length) await showDeliveries(deliveries, d.webhookEndpoints[0]);
}

async function showDeliveries(box, ep) {
  clear(box);
  let d;
  try {
    d = await gql(`query($e: ID) { webhookDeliveries(endpointId: $e, first: 20) { edges { node { id webhookId eventType runId state nextAttemptAt lastStatus lastError createdAt
      attempts { attempt startedAt latencyMs statusCode error } } } } }`, { e: ep.id });
  } catch (e) { box.append(errorBox(e)); return; }
  const rows = d.webhookDeliveries.edges.map((e) => e.node);
  box.append(h('section', { class: 'card flush', 'aria-labelledby': 'dl-title' }, h('h2', { id: 'dl-title', class: 'card-title' }, 'Deliveries to ', h('span', { class: 'mono' }, ep.url)),
    rows.length ? table(['Event', 'Run', 'State', 'Created', 'Attempts', ''], rows.map((x) => h('tr', null,
      h('td', { class: 'mono' }, x.eventType), h('td', null, x.runId ? h('a', { href: '/runs/' + x.runId }, shortId(x.runId)) : '—'),
      h('td', null, h('span', { class: 'badge st-' + ({ SUCCEEDED: 'completed', FAILED: 'failed', DEAD: 'cancelled', PENDING: 'pending' }[x.state]) }, x.state.toLowerCase()),
        x.nextAttemptAt ? h('div', { class: 'muted small' }, 'next ' + fmtTime(x.nextAttemptAt)) : null),
      h('td', null, fmtTime(x.createdAt)),
      h('td', null, x.attempts.length ? h('ol', { class: 'attempts small' }, x.attempts.map((a) => h('li', null,
        `#${a.attempt} ${fmtTime(a.startedAt)} · `, a.statusCode ? `HTTP ${a.statusCode}` : (a.error || 'no response'), a.latencyMs !== null ? ` · ${a.latencyMs} ms` : ''))) : '—'),
      h('td', null, h('button', { class: 'btn small', onclick: async () => {
        if (!(await ask({ title: 'Send this delivery again?', body: 'Same webhook-id and body, sent now.', confirm: 'Redeliver' }))) return;
        try { await gql(`mutation($id: ID!) { redeliverWebhook(deliveryId: $id) { id } }`, { id: x.id }); toast('Redelivery queued.'); showDeliveries(box, ep); } catch (e) { fail(e); }
      } }, 'Redeliver')))), { caption: 'Deliveries, newest first' }) : h('div', { class: 'pad' }, empty('No deliveries yet.'))));
}

const money = (cents, cur) => (Number(cents) / 100).toLocaleString(undefined, { style: 'currency', currency: cur || 'USD' });
// A unit price is often a fraction of a cent: up to six decimals.
const unitPrice = (micros, cur) => (Number(micros) / 1e6).toLocaleString(undefined, { style: 'currency', currency: cur || 'USD', minimumFractionDigits: 2, maximumFractionDigits: 6 });

async function usage(body, ctx) {
  const d = await gql(`{ tenant { name plan streamShards limits { maxRunningTasks startsPerSecond startBurst maxQueuedTasks weight spendCapCents maxRateLimits }
    usage { runningRuns queuedTasks runningTasks period asOf ${ctx.can('billing:read') ? 'meters { meter quantity unit }' : ''} } } }`);
  const t = d.tenant;
  const l = t.limits, u = t.usage;
  const meter = (label, now, max) => h('div', { class: 'stat' }, h('span', { class: 'n' }, `${now}`, h('span', { class: 'muted' }, ` / ${max}`)), h('span', { class: 'l' }, label),
    h('div', { class: 'meter', role: 'meter', 'aria-valuenow': now, 'aria-valuemin': 0, 'aria-valuemax': max, 'aria-label': label }, h('span', { style: null, dataset: { pct: Math.min(100, Math.round((now / Math.max(1, max)) * 100)) } })));
  body.append(h('section', { class: 'card', 'aria-labelledby': 'u-now' }, h('h2', { id: 'u-now' }, `Now · plan ${t.plan}`),
    h('div', { class: 'stat-row' }, meter('Running tasks', u.runningTasks, l.maxRunningTasks), meter('Queued tasks', u.queuedTasks, l.maxQueuedTasks),
      h('div', { class: 'stat' }, h('span', { class: 'n' }, String(u.runningRuns)), h('span', { class: 'l' }, 'Running runs')))),
  h('section', { class: 'card', 'aria-labelledby': 'u-lim' }, h('h2', { id: 'u-lim' }, 'Limits'),
    h('dl', { class: 'kv' },
      h('dt', null, 'Tasks running at once'), h('dd', null, l.maxRunningTasks),
      h('dt', null, 'Starts per second (burst)'), h('dd', null, `${l.startsPerSecond} (${l.startBurst})`),
      h('dt', null, 'Tasks waiting for a worker'), h('dd', null, l.maxQueuedTasks),
      h('dt', null, 'Scheduling weight'), h('dd', null, l.weight),
      h('dt', null, 'Step rate limits'), h('dd', null, l.maxRateLimits),
      h('dt', null, 'Monthly spend cap'), h('dd', null, l.spendCapCents === null ? 'none' : money(l.spendCapCents)),
      h('dt', null, 'Stream shards'), h('dd', null, t.streamShards))));
  for (const el of body.querySelectorAll('.meter span')) el.style.width = el.dataset.pct + '%';
  if (!ctx.can('billing:read')) return;
  try {
    const inv = (await gql(`{ invoicePreview { period plan currency baseFeeCents totalCents spendCapCents capsReached asOf
      lineItems { meter quantity included billable unitPriceMicros amountCents hardCap capReached } } }`)).invoicePreview;
    body.append(h('section', { class: 'card flush', 'aria-labelledby': 'u-inv' }, h('h2', { id: 'u-inv', class: 'card-title' }, `Invoice preview · ${inv.period}`,
      h('span', { class: 'muted small' }, ` complete up to ${fmtTime(inv.asOf)}`)),
    table(['Meter', 'Used', 'Included', 'Billable', 'Unit price', 'Amount', 'Hard cap'], [
      h('tr', null, h('td', null, 'Base fee'), h('td'), h('td'), h('td'), h('td'), h('td', null, money(inv.baseFeeCents, inv.currency)), h('td')),
      ...inv.lineItems.map((li) => h('tr', { class: li.capReached ? 'warn-row' : '' }, h('td', { class: 'mono' }, li.meter), h('td', null, li.quantity), h('td', null, li.included),
        h('td', null, li.billable), h('td', null, unitPrice(li.unitPriceMicros, inv.currency)), h('td', null, money(li.amountCents, inv.currency)),
        h('td', null, li.hardCap === null ? '—' : li.hardCap, li.capReached ? h('span', { class: 'tag err' }, 'reached') : null))),
      h('tr', { class: 'total' }, h('th', { scope: 'row' }, 'Total'), h('td'), h('td'), h('td'), h('td'), h('td', null, money(inv.totalCents, inv.currency)), h('td'))], { caption: 'Invoice preview' }),
    inv.capsReached.length ? h('p', { class: 'pad error' }, 'New runs are refused: ', inv.capsReached.join(', ')) : null));
  } catch (e) { body.append(errorBox(e)); }
}
