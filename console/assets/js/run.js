// One run: its DAG coloured by task state (live through runUpdated), why it
// waits, the selected node's input, output, error and attempts, the
// timeline, and the actions the viewer may take.

import { gql, subscribe } from './api.js';
import { h, clear, errorBox, status, fmtTime, fmtDuration, since, shortId, pre, ask, toast, empty, fail } from './ui.js';
import { layout, render, nodesOf } from './dag.js';

const TASK = `id nodeId nodeType queue handler state attempt maxAttempts input output lastError skipReason childRunId waitingUntil createdAt startedAt finishedAt
  secretDerived`;
const RUN = `id status workflow { id name } workflowVersion input output error idempotencyKey metadata priority rerunOf
  concurrencyKey parentRunId parentNode createdAt updatedAt finishedAt startedBy secretDerived tasks { ${TASK} }
  approvals { node signal waiting who mayApprove reason }`;
// What a principal without secrets:outputs reads in place of a value
// derived from a secret (the server hides it; this only explains it).
const HIDDEN = 'Hidden: this value may hold what a step that read a secret produced; reading it needs the secrets:outputs permission.';
const TIMELINE = `query($id: ID!) { run(id: $id) { timeline(first: 200) { id kind nodeId taskId attempt detail createdAt } } }`;
const defCache = new Map();

export async function page(main, ctx, id) {
  const d = await gql(`query($id: ID!) { run(id: $id) { ${RUN} timeline(first: 200) { id kind nodeId taskId attempt detail createdAt } } workers { id handlers queues } }`, { id });
  let run = d.run;
  const workers = d.workers;
  let timeline = run.timeline;
  const key = run.workflow.id + '@' + run.workflowVersion;
  if (!defCache.has(key)) {
    const v = await gql(`query($w: ID!, $n: Int!) { workflow(id: $w) { version(number: $n) { definition } } }`, { w: run.workflow.id, n: run.workflowVersion });
    defCache.set(key, v.workflow.version.definition);
  }
  const def = defCache.get(key);

  const t0 = performance.now();
  const nodes = nodesOf(def);
  const lay = layout(nodes);
  const header = h('div', { class: 'page-head' });
  const waitBox = h('div', { id: 'waiting' });
  const graphBox = h('div', { class: 'graph', id: 'graph' });
  const detail = h('aside', { class: 'card detail', id: 'node-detail', 'aria-label': 'Selected node', 'aria-live': 'polite' });
  const tlBox = h('div', { id: 'timeline' });
  const ioBox = h('div', { class: 'io' });
  main.append(header, waitBox,
    h('div', { class: 'run-grid' },
      h('section', { class: 'card flush', 'aria-labelledby': 'g-title' }, h('h2', { id: 'g-title', class: 'card-title' }, 'Graph',
        h('span', { class: 'legend' }, ['pending', 'running', 'waiting', 'completed', 'failed', 'skipped', 'cancelled'].map((x) => h('span', { class: 'lg s-' + x }, x)))), graphBox),
      detail),
    h('section', { class: 'card', 'aria-labelledby': 'io-title' }, h('h2', { id: 'io-title' }, 'Input and result'), ioBox),
    h('section', { class: 'card', 'aria-labelledby': 'tl-title' }, h('h2', { id: 'tl-title' }, 'Timeline'), tlBox));

  let selected = null;
  const tasksByNode = () => {
    const m = new Map();
    for (const t of run.tasks) if (!m.has(t.nodeId) || t.attempt >= m.get(t.nodeId).attempt) m.set(t.nodeId, t);
    return m;
  };
  const graph = render(graphBox, lay, {
    states: tasksByNode(), label: `Graph of run ${shortId(run.id)}: ${lay.ids.length} nodes`,
    onSelect: (nid) => { selected = nid; graph.select(nid); drawDetail(); },
  });

  // The header and the waiting box are rebuilt only when what they show
  // changes, so a button is not replaced under the pointer or the focus.
  let headerKey = '', waitKey = '';
  const drawHeader = () => {
    const k = run.status + (run.finishedAt || '');
    if (k === headerKey) return;
    headerKey = k;
    const acts = actions(ctx, run, refresh);
    clear(header).append(
      h('div', null,
        h('div', { class: 'crumbs' }, h('a', { href: '/runs' }, 'Runs'), ' / ', h('a', { href: '/workflows/' + run.workflow.id }, run.workflow.name)),
        h('h1', null, `Run ${shortId(run.id)} `, status(run.status)),
        h('p', { class: 'muted mono small' }, run.id, ` · v${run.workflowVersion} · created ${fmtTime(run.createdAt)}`,
          run.finishedAt ? ` · took ${fmtDuration(since(run.createdAt, run.finishedAt))}` : '',
          run.startedBy ? ` · started by ${run.startedBy}` : '',
          run.rerunOf ? h('span', null, ' · rerun of ', h('a', { href: '/runs/' + run.rerunOf }, shortId(run.rerunOf))) : '',
          run.parentRunId ? h('span', null, ' · child of ', h('a', { href: '/runs/' + run.parentRunId }, shortId(run.parentRunId)), ` (${run.parentNode})`) : '')),
      h('div', { class: 'actions', id: 'run-actions' }, acts));
  };
  const drawWaiting = () => {
    const reasons = whyWaiting(run, nodes, workers);
    const k = JSON.stringify(reasons);
    if (k === waitKey) return;
    waitKey = k;
    clear(waitBox);
    if (!reasons.length) return;
    waitBox.append(h('section', { class: 'callout', 'aria-labelledby': 'w-title' }, h('h2', { id: 'w-title' }, 'Why this run waits'),
      h('ul', null, reasons.map((r) => h('li', { dataset: { node: r.node || '' } }, r.text,
        r.who ? h('span', { class: 'who', dataset: { who: r.node } }, ` Who may approve: ${r.who}.`) : null,
        r.approval && ctx.can('runs:write') ? h('span', { class: 'inline-actions' },
          h('button', { class: 'btn small primary', dataset: { approve: r.node }, disabled: r.mayApprove === false, title: r.reason || null,
            onclick: () => decide(run, r.signal, true, refresh) }, 'Approve…'),
          h('button', { class: 'btn small danger', dataset: { reject: r.node }, disabled: r.mayApprove === false, title: r.reason || null,
            onclick: () => decide(run, r.signal, false, refresh) }, 'Reject…')) : null,
        r.approval && ctx.can('runs:write') && r.mayApprove === false ? h('span', { class: 'why-not', dataset: { whyNot: r.node } }, ` You may not answer it: ${r.reason}.`) : null,
        r.signal && !r.approval && ctx.can('runs:write') ? h('span', { class: 'inline-actions' },
          h('button', { class: 'btn small', dataset: { signal: r.node }, onclick: () => signal(run, r.signal, refresh) }, `Send “${r.signal}”…`)) : null)))));
  };
  const drawDetail = () => {
    clear(detail);
    if (!selected) { detail.append(h('h2', null, 'Node'), empty('Select a node in the graph (click, or Tab then Enter) to see its input, output, error and attempts.')); return; }
    const n = lay.byId.get(selected);
    const t = tasksByNode().get(selected);
    const evs = timeline.filter((e) => e.nodeId === selected || ((e.detail && e.detail.actions) || []).some((a) => a.node === selected));
    // h() skips absent parts (native append would write "null").
    detail.append(h('div', null, h('h2', null, selected, ' ', t ? status(t.state) : h('span', { class: 'badge' }, 'not started')),
      h('dl', { class: 'kv' },
        h('dt', null, 'Type'), h('dd', null, n.type),
        t ? [h('dt', null, 'Attempt'), h('dd', null, `${t.attempt} of ${t.maxAttempts}`)] : null,
        t && t.queue ? [h('dt', null, 'Queue'), h('dd', null, t.queue)] : null,
        t && t.handler ? [h('dt', null, 'Handler'), h('dd', null, t.handler)] : null,
        t && t.startedAt ? [h('dt', null, 'Started'), h('dd', null, fmtTime(t.startedAt))] : null,
        t && t.finishedAt ? [h('dt', null, 'Took'), h('dd', null, fmtDuration(since(t.startedAt || t.createdAt, t.finishedAt)))] : null,
        t && t.skipReason ? [h('dt', null, 'Skipped'), h('dd', null, t.skipReason)] : null,
        t && t.childRunId ? [h('dt', null, 'Child run'), h('dd', null, h('a', { href: '/runs/' + t.childRunId }, shortId(t.childRunId)))] : null),
      t && t.secretDerived && !ctx.can('secrets:outputs') ? h('p', { class: 'note', id: 'hidden-note' }, HIDDEN) : null,
      t && t.lastError ? [h('h3', null, 'Error'), h('pre', { class: 'json err' }, JSON.stringify(t.lastError, null, 2))] : null,
      h('h3', null, 'Input'), pre(t ? t.input : null),
      h('h3', null, 'Output'), pre(t ? t.output : null),
      h('h3', null, 'Attempts and events'), evs.length ? h('ol', { class: 'attempts' }, evs.map((e) => h('li', null,
        h('span', { class: 'mono' }, e.kind), e.attempt ? ` #${e.attempt}` : '', ' · ', fmtTime(e.createdAt),
        ((e.detail && e.detail.actions) || []).filter((a) => a.node === selected).map((a) =>
          h('div', { class: 'small muted mono' }, a.kind, a.attempt ? ` #${a.attempt}` : '', a.state ? ` → ${a.state}` : '', a.fire_at ? ` at ${fmtTime(a.fire_at)}` : '',
            a.not_before ? ` retry after ${fmtTime(a.not_before)}` : '', a.error ? ` · ${typeof a.error === 'string' ? a.error : JSON.stringify(a.error)}` : ''))))) : empty('No events yet.')));
  };
  const drawIO = () => {
    clear(ioBox).append(run.secretDerived && !ctx.can('secrets:outputs') ? h('p', { class: 'note' }, HIDDEN) : '', h('div', { class: 'cols' },
      h('div', null, h('h3', null, 'Input'), pre(run.input)),
      h('div', null, h('h3', null, run.error ? 'Error' : 'Output'), run.error ? h('pre', { class: 'json err' }, JSON.stringify(run.error, null, 2)) : pre(run.output)),
      h('div', null, h('h3', null, 'Metadata'), pre(run.metadata), run.concurrencyKey ? h('p', null, 'Concurrency key ', h('code', null, run.concurrencyKey)) : null,
        run.idempotencyKey ? h('p', null, 'Idempotency key ', h('code', null, run.idempotencyKey)) : null, h('p', null, `Priority ${run.priority}`))));
  };
  const drawTimeline = () => {
    clear(tlBox);
    if (!timeline.length) { tlBox.append(empty('No events yet.')); return; }
    const start = new Date(timeline[0].createdAt);
    tlBox.append(h('table', { class: 'table compact' }, h('caption', { class: 'sr-only' }, 'Timeline, oldest first'),
      h('thead', null, h('tr', null, ['At', '+', 'Event', 'Node', 'Attempt', 'Detail'].map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', null, timeline.map((e) => h('tr', null,
        h('td', null, fmtTime(e.createdAt)), h('td', { class: 'muted' }, fmtDuration(new Date(e.createdAt) - start)),
        h('td', { class: 'mono' }, e.kind), h('td', null, e.nodeId ? h('button', { class: 'linklike', onclick: () => { selected = e.nodeId; graph.select(selected); drawDetail(); } }, e.nodeId) : '—'),
        h('td', null, e.attempt || ''), h('td', { class: 'small mono clip' }, e.detail && Object.keys(e.detail).length ? JSON.stringify(e.detail) : ''))))));
  };
  const drawAll = () => { drawHeader(); drawWaiting(); drawDetail(); drawIO(); drawTimeline(); };
  drawAll();
  const ms = performance.now() - t0;
  main.dataset.renderMs = ms.toFixed(1);
  main.dataset.nodes = String(lay.ids.length);
  window.composer.lastRenderMs = ms;

  let tlTimer = null;
  const refreshTimeline = () => {
    if (tlTimer) return; // one read per 250 ms however many updates come
    tlTimer = setTimeout(async () => {
      tlTimer = null;
      try { timeline = (await gql(TIMELINE, { id })).run.timeline; drawTimeline(); drawDetail(); drawWaiting(); } catch { /* the next update retries */ }
    }, 250);
  };
  let lastUpdate = Date.now();
  const apply = (r) => {
    lastUpdate = Date.now();
    run = { ...run, ...r };
    graph.update(tasksByNode());
    drawHeader(); drawWaiting(); drawDetail(); drawIO();
    refreshTimeline();
  };
  async function refresh() {
    try { apply((await gql(`query($id: ID!) { run(id: $id) { ${RUN} } }`, { id })).run); } catch (e) { fail(e); }
  }
  const unsub = subscribe(`subscription($id: ID!) { runUpdated(id: $id) { ${RUN} } }`, { id }, (x) => apply(x.runUpdated),
    (e) => toast(`Live updates stopped: ${e.code}`, 'err'));
  // An update between the page's read and its subscription taking effect,
  // or one lost with a dropped socket, is caught by a read once the
  // subscription stands and then now and then while the run goes on.
  const ended = () => ['COMPLETED', 'FAILED', 'CANCELLED'].includes(String(run.status).toUpperCase());
  const settle = setTimeout(refresh, 1000);
  const safety = setInterval(() => { if (!ended() && Date.now() - lastUpdate > 4000) refresh(); }, 5000);
  return () => { unsub(); clearTimeout(tlTimer); clearTimeout(settle); clearInterval(safety); };
}

function actions(ctx, run, refresh) {
  if (!ctx.can('runs:write')) return [];
  const out = [];
  const live = run.status === 'RUNNING' || run.status === 'QUEUED';
  if (live) {
    out.push(h('button', { class: 'btn', id: 'act-signal', onclick: () => signal(run, '', refresh) }, 'Signal…'));
    out.push(h('button', { class: 'btn danger', id: 'act-cancel', onclick: async () => {
      const v = await ask({ title: 'Cancel this run?', body: 'Running steps are stopped; finished work is kept.', danger: true, confirm: 'Cancel run',
        fields: [{ name: 'reason', label: 'Reason (optional)' }] });
      if (!v) return;
      try { await gql(`mutation($id: ID!, $r: String) { cancelRun(id: $id, reason: $r) { id status } }`, { id: run.id, r: v.reason || null }); toast('Run cancelled.'); refresh(); }
      catch (e) { fail(e); }
    } }, 'Cancel…'));
  } else {
    if (run.status === 'FAILED' || run.status === 'CANCELLED') {
      out.push(h('button', { class: 'btn', id: 'act-rerun', onclick: () => rerun(ctx, run, 'FROM_FAILED', refresh) }, 'Re-run from failed…'));
    }
    out.push(h('button', { class: 'btn', id: 'act-rerun-new', onclick: () => rerun(ctx, run, 'AS_NEW', refresh) }, 'Re-run as new…'));
  }
  return out;
}

async function rerun(ctx, run, mode, refresh) {
  const fromFailed = mode === 'FROM_FAILED';
  const v = await ask({ title: fromFailed ? 'Re-run from the failed nodes?' : 'Re-run as a new run?',
    body: fromFailed ? 'This run continues: its failed and cancelled nodes run again, completed ones are kept.' : 'A new run starts with the same input.',
    confirm: 'Re-run' });
  if (!v) return;
  try {
    const d = await gql(`mutation($id: ID!, $m: RerunMode) { rerunRun(id: $id, mode: $m) { id status } }`, { id: run.id, m: mode });
    toast('Re-run started.');
    if (d.rerunRun.id !== run.id) ctx.navigate('/runs/' + d.rerunRun.id); else refresh();
  } catch (e) { fail(e); }
}

async function signal(run, name, refresh) {
  const v = await ask({ title: 'Send a signal', confirm: 'Send', fields: [
    { name: 'name', label: 'Signal name', value: name, required: true },
    { name: 'payload', label: 'Payload (JSON, optional)', type: 'textarea', json: true, rows: 4, value: '' }] });
  if (!v) return;
  try {
    const d = await gql(`mutation($id: ID!, $n: String!, $p: JSON) { signalRun(id: $id, name: $n, payload: $p) { ignored reason } }`, { id: run.id, n: v.name, p: v.payload });
    toast(d.signalRun.ignored ? `Signal ignored: ${d.signalRun.reason || 'the run did not take it'}` : 'Signal sent.', d.signalRun.ignored ? 'err' : 'ok');
    refresh();
  } catch (e) { fail(e); }
}

async function decide(run, sig, approved, refresh) {
  const v = await ask({ title: approved ? 'Approve?' : 'Reject?', body: approved ? 'The run continues past this approval.' : 'A rejection fails the waiting node.',
    confirm: approved ? 'Approve' : 'Reject', danger: !approved, fields: [{ name: 'comment', label: 'Comment (optional)', type: 'textarea', rows: 3 }] });
  if (!v) return;
  try {
    const d = await gql(`mutation($id: ID!, $s: String, $a: Boolean!, $c: String) { approve(id: $id, signal: $s, approved: $a, comment: $c) { ignored reason } }`,
      { id: run.id, s: sig || 'approval', a: approved, c: v.comment || null });
    toast(d.approve.ignored ? `Ignored: ${d.approve.reason || ''}` : approved ? 'Approved.' : 'Rejected.', d.approve.ignored ? 'err' : 'ok');
    refresh();
  } catch (e) { fail(e); }
}

/** whyWaiting explains each thing the run waits for, from its tasks, its definition and the connected workers. */
export function whyWaiting(run, nodes, workers) {
  if (run.status !== 'RUNNING' && run.status !== 'QUEUED') return [];
  const out = [];
  const byId = new Map(nodes.map((n) => [n.id, n]));
  if (run.status === 'QUEUED') {
    out.push({ text: run.concurrencyKey ? `Queued: the concurrency limit of key “${run.concurrencyKey}” is reached, or the workflow is paused.` : 'Queued: the workflow is paused; nothing runs until it is resumed.' });
  }
  for (const t of run.tasks) {
    const n = byId.get(t.nodeId) || {};
    if (t.state === 'WAITING') {
      if (t.nodeType === 'sleep') {
        // waitingUntil: when the task's timer fires (the API's own answer).
        out.push({ node: t.nodeId, text: `“${t.nodeId}” sleeps until ${t.waitingUntil ? fmtTime(t.waitingUntil) : 'its timer fires'}.` });
      } else if (t.nodeType === 'wait') {
        const w = n.wait || {};
        const timeout = t.waitingUntil ? ` (times out at ${fmtTime(t.waitingUntil)})` : w.timeout ? ` (times out after ${w.timeout})` : '';
        if (w.event) out.push({ node: t.nodeId, text: `“${t.nodeId}” waits for an event “${w.event}”${w.match ? ` matching ${w.match}` : ''}${timeout}.` });
        else if (w.approval) {
          // Who may answer, as the server decides it (Run.approvals).
          const a = (run.approvals || []).find((x) => x.node === t.nodeId) || {};
          out.push({ node: t.nodeId, approval: true, signal: w.signal || 'approval', who: a.who, mayApprove: a.mayApprove, reason: a.reason,
            text: `“${t.nodeId}” waits for an approval (signal “${w.signal || 'approval'}”)${timeout}.` });
        }
        else out.push({ node: t.nodeId, signal: w.signal, text: `“${t.nodeId}” waits for the signal “${w.signal}”${timeout}.` });
      } else if (t.childRunId) {
        out.push({ node: t.nodeId, text: `“${t.nodeId}” waits for its child run ${shortId(t.childRunId)}.` });
      } else {
        out.push({ node: t.nodeId, text: `“${t.nodeId}” waits.` });
      }
    } else if (t.state === 'PENDING' && t.handler) {
      const queue = t.queue || 'default';
      const served = workers.some((w) => w.handlers.includes(t.handler) && (!w.queues.length || w.queues.includes(queue)));
      if (!served) out.push({ node: t.nodeId, text: `“${t.nodeId}” waits for a worker: no connected worker serves the handler “${t.handler}” on queue “${queue}”.` });
    } else if (t.state === 'RUNNING' && t.nodeType === 'workflow' && t.childRunId) {
      out.push({ node: t.nodeId, text: `“${t.nodeId}” waits for its child run ${shortId(t.childRunId)}.` });
    }
  }
  return out;
}
