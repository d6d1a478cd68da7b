// The runs list: filters kept in the URL, keyset pagination ("Load more"
// follows pageInfo.endCursor), counts by status (runCounts) and live rows
// (runsChanged).

import { gql, subscribe } from './api.js';
import { h, clear, errorBox, status, fmtTime, fmtDuration, since, shortId, empty, ask, toast, fail } from './ui.js';

const STATUSES = ['QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED'];
const PAGE = 50;
const pageSize = () => Math.min(100, Math.max(1, parseInt(new URLSearchParams(location.search).get('first'), 10) || PAGE));

const RUN_FIELDS = `id status workflow { id name } workflowVersion createdAt finishedAt metadata`;
const RUNS = `query($first: Int, $after: String, $filter: RunFilter) {
  runs(first: $first, after: $after, filter: $filter) { edges { node { ${RUN_FIELDS} } } pageInfo { hasNextPage endCursor } } }`;
const COUNTS = `query($filter: RunFilter) { runCounts(filter: $filter) { status count } }`;
const WORKFLOWS = `{ workflows(first: 100) { edges { node { id name latestVersion } } } }`;

function filterFromURL() {
  const q = new URLSearchParams(location.search);
  const f = {};
  const st = q.getAll('status').filter((x) => STATUSES.includes(x));
  if (st.length) f.status = st;
  if (q.get('workflow')) f.workflowId = q.get('workflow');
  if (q.get('after')) f.createdAfter = new Date(q.get('after')).toISOString();
  if (q.get('before')) f.createdBefore = new Date(q.get('before')).toISOString();
  const meta = q.getAll('meta').map((kv) => kv.split('=')).filter((kv) => kv.length === 2 && kv[0]);
  if (meta.length) f.metadata = Object.fromEntries(meta);
  return f;
}

function matches(f, run) {
  if (f.status && !f.status.includes(run.status)) return false;
  if (f.workflowId && run.workflow.id !== f.workflowId) return false;
  if (f.createdAfter && run.createdAt < f.createdAfter) return false;
  if (f.createdBefore && run.createdAt >= f.createdBefore) return false;
  if (f.metadata) for (const [k, v] of Object.entries(f.metadata)) if ((run.metadata || {})[k] !== v) return false;
  return true;
}

export async function page(main, ctx) {
  const filter = filterFromURL();
  const q = new URLSearchParams(location.search);
  const wfs = await gql(WORKFLOWS).then((d) => d.workflows.edges.map((e) => e.node)).catch(() => []);

  const head = h('div', { class: 'page-head' }, h('h1', null, 'Runs'),
    ctx.can('runs:write') ? h('button', { class: 'btn primary', id: 'start-run', onclick: () => startRun(ctx, wfs) }, 'Start a run') : null);

  const statusBoxes = h('fieldset', { class: 'checks inline' }, h('legend', null, 'Status'),
    STATUSES.map((st) => h('label', null, h('input', { type: 'checkbox', name: 'status', value: st, checked: (filter.status || []).includes(st) }), ' ', st.toLowerCase())));
  const wfSel = h('select', { id: 'flt-workflow', name: 'workflow' }, h('option', { value: '' }, 'All workflows'),
    wfs.map((w) => h('option', { value: w.id }, w.name)));
  wfSel.value = filter.workflowId || '';
  const after = h('input', { id: 'flt-after', type: 'datetime-local', name: 'after', value: q.get('after') || '' });
  const before = h('input', { id: 'flt-before', type: 'datetime-local', name: 'before', value: q.get('before') || '' });
  const meta = h('input', { id: 'flt-meta', name: 'meta', placeholder: 'customer=c_42', value: q.getAll('meta').join(' ') });
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter runs', onsubmit: (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const c of statusBoxes.querySelectorAll('input:checked')) p.append('status', c.value);
    if (wfSel.value) p.set('workflow', wfSel.value);
    if (after.value) p.set('after', after.value);
    if (before.value) p.set('before', before.value);
    for (const kv of meta.value.split(/\s+/).filter(Boolean)) p.append('meta', kv);
    ctx.navigate('/runs' + (p.toString() ? '?' + p : ''));
  } },
  statusBoxes,
  h('div', { class: 'field' }, h('label', { for: 'flt-workflow' }, 'Workflow'), wfSel),
  h('div', { class: 'field' }, h('label', { for: 'flt-after' }, 'Created after'), after),
  h('div', { class: 'field' }, h('label', { for: 'flt-before' }, 'Created before'), before),
  h('div', { class: 'field' }, h('label', { for: 'flt-meta' }, 'Metadata (key=value)'), meta),
  h('div', { class: 'field end' }, h('button', { class: 'btn', type: 'submit' }, 'Apply'),
    h('a', { class: 'btn link', href: '/runs' }, 'Clear')));

  const counts = h('div', { class: 'counts', 'aria-label': 'Runs by status', role: 'region' });
  const tbody = h('tbody');
  const listErr = h('div');
  const more = h('button', { class: 'btn', id: 'load-more', hidden: true }, 'Load more');
  const tbl = h('table', { class: 'table runs' }, h('caption', { class: 'sr-only' }, 'Runs, newest first'),
    h('thead', null, h('tr', null, ['Run', 'Workflow', 'Status', 'Created', 'Duration', 'Metadata'].map((x) => h('th', { scope: 'col' }, x)))), tbody);
  main.append(head, form, counts, listErr, h('div', { class: 'card flush' }, tbl), h('div', { class: 'more' }, more));

  const rows = new Map();
  const rowOf = (r) => h('tr', { dataset: { run: r.id, status: r.status } },
    h('td', null, h('a', { href: '/runs/' + r.id, class: 'mono' }, shortId(r.id))),
    h('td', null, h('a', { href: '/workflows/' + r.workflow.id }, r.workflow.name), h('span', { class: 'muted' }, ` v${r.workflowVersion}`)),
    h('td', null, status(r.status)),
    h('td', null, h('time', { datetime: r.createdAt }, fmtTime(r.createdAt))),
    h('td', null, fmtDuration(since(r.createdAt, r.finishedAt))),
    h('td', { class: 'meta' }, Object.entries(r.metadata || {}).slice(0, 3).map(([k, v]) => h('span', { class: 'tag' }, `${k}=${v}`))));
  const put = (r, prepend) => {
    const tr = rowOf(r);
    const old = rows.get(r.id);
    if (old) old.replaceWith(tr);
    else if (prepend) tbody.prepend(tr);
    else tbody.append(tr);
    rows.set(r.id, tr);
  };

  let cursor = null;
  const load = async () => {
    more.disabled = true;
    try {
      const d = await gql(RUNS, { first: pageSize(), after: cursor, filter });
      for (const e of d.runs.edges) put(e.node, false);
      cursor = d.runs.pageInfo.endCursor;
      more.hidden = !d.runs.pageInfo.hasNextPage;
      if (!rows.size) clear(listErr).append(empty('No runs match these filters.'));
    } catch (e) { clear(listErr).append(errorBox(e)); }
    more.disabled = false;
  };
  more.addEventListener('click', load);

  const loadCounts = async () => {
    try {
      const d = await gql(COUNTS, { filter: { ...filter, status: undefined } });
      const by = Object.fromEntries(d.runCounts.map((c) => [c.status, c.count]));
      clear(counts).append(...STATUSES.map((st) => h('a', { class: 'count st-' + st.toLowerCase(), href: '/runs?status=' + st, dataset: { status: st } },
        h('span', { class: 'n' }, String(by[st] || 0)), h('span', { class: 'l' }, st.toLowerCase()))));
    } catch (e) {
      clear(counts).append(h('p', { class: 'muted', id: 'counts-unavailable' }, e.code === 'GRAPHQL_VALIDATION_FAILED'
        ? 'Counts by status are not available on this server (it has no runCounts query).' : `Counts unavailable: ${e.code}`));
    }
  };

  await Promise.all([load(), loadCounts()]);
  let countTimer = null;
  const unsub = subscribe(`subscription { runsChanged { event run { ${RUN_FIELDS} } } }`, {}, (d) => {
    const r = d.runsChanged.run;
    if (rows.has(r.id) || (matches(filter, r) && !q.get('before'))) {
      if (!rows.size) clear(listErr);
      put(r, !rows.has(r.id));
    }
    if (!countTimer) countTimer = setTimeout(() => { countTimer = null; loadCounts(); }, 1000);
  }, (e) => clear(listErr).append(errorBox(e)));
  return () => { unsub(); clearTimeout(countTimer); };
}

async function startRun(ctx, wfs) {
  if (!wfs.length) { toast('Create a workflow first.', 'err'); return; }
  const v = await ask({
    title: 'Start a run', confirm: 'Start',
    fields: [
      { name: 'workflow', label: 'Workflow', type: 'select', options: wfs.map((w) => ({ value: w.id, label: `${w.name} (v${w.latestVersion})` })) },
      { name: 'input', label: 'Input (JSON)', type: 'textarea', json: true, value: '{}' },
      { name: 'metadata', label: 'Metadata (JSON object of strings, optional)', type: 'textarea', json: true, rows: 2, value: '' },
      { name: 'idem', label: 'Idempotency key (optional)' },
    ],
  });
  if (!v) return;
  try {
    const d = await gql(`mutation($in: StartRunInput!) { startRun(input: $in) { created run { id } } }`,
      { in: { workflowId: v.workflow, input: v.input, metadata: v.metadata || undefined, idempotencyKey: v.idem || undefined } });
    toast(d.startRun.created ? 'Run started.' : 'A run with this idempotency key exists: showing it.');
    ctx.navigate('/runs/' + d.startRun.run.id);
  } catch (e) { fail(e); }
}
