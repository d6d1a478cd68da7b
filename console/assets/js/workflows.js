// Workflows: the list, one workflow's versions with a side-by-side diff of
// two definitions and a graph of each, and the editor that creates a
// workflow or publishes its next version, previewing the graph on the
// client and showing validation problems on the nodes they name.

import { gql } from './api.js';
import { h, clear, errorBox, fmtTime, table, empty, toast } from './ui.js';
import { layout, render, nodesOf } from './dag.js';

export async function page(main, ctx) {
  const d = await gql(`{ workflows(first: 100) { edges { node { id name description latestVersion updatedAt } } } }`);
  const wfs = d.workflows.edges.map((e) => e.node);
  main.append(h('div', { class: 'page-head' }, h('h1', null, 'Workflows'),
    ctx.can('workflows:write') ? h('a', { class: 'btn primary', href: '/workflows/new', id: 'new-workflow' }, 'New workflow') : null),
  wfs.length ? h('div', { class: 'card flush' }, table(['Name', 'Description', 'Latest version', 'Updated'], wfs.map((w) => h('tr', null,
    h('td', null, h('a', { href: '/workflows/' + w.id }, w.name)), h('td', { class: 'muted' }, w.description || '—'),
    h('td', null, 'v' + w.latestVersion), h('td', null, fmtTime(w.updatedAt)))), { caption: 'Workflows' })) : empty('No workflows yet.'));
}

export async function detail(main, ctx, id) {
  const d = await gql(`query($id: ID!) { workflow(id: $id) { id name description latestVersion createdAt versions(first: 100) { version createdAt definition } } }`, { id });
  const wf = d.workflow;
  const versions = wf.versions;
  const pick = (n) => versions.find((v) => v.version === n);
  const q = new URLSearchParams(location.search);
  let right = parseInt(q.get('b'), 10) || wf.latestVersion;
  let left = parseInt(q.get('a'), 10) || Math.max(1, right - 1);

  main.append(h('div', { class: 'page-head' },
    h('div', null, h('div', { class: 'crumbs' }, h('a', { href: '/workflows' }, 'Workflows')), h('h1', null, wf.name, h('span', { class: 'muted' }, ` v${wf.latestVersion}`)),
      wf.description ? h('p', { class: 'muted' }, wf.description) : null),
    h('div', { class: 'actions' },
      h('a', { class: 'btn', href: `/runs?workflow=${wf.id}` }, 'Runs'),
      ctx.can('workflows:write') ? h('a', { class: 'btn primary', id: 'publish', href: `/workflows/new?from=${wf.id}` }, 'Publish a new version') : null)));

  const graphBox = h('div', { class: 'graph' });
  const diffBox = h('div', { id: 'diff' });
  const selA = h('select', { id: 'ver-a' }, versions.map((v) => h('option', { value: v.version }, 'v' + v.version)));
  const selB = h('select', { id: 'ver-b' }, versions.map((v) => h('option', { value: v.version }, 'v' + v.version)));
  selA.value = left; selB.value = right;
  const draw = () => {
    left = +selA.value; right = +selB.value;
    const a = pick(left), b = pick(right);
    clear(diffBox).append(a && b ? sideBySide(a, b) : empty('Pick two versions.'));
    // Open the diff at its first change, with a few lines of context.
    const wrap = diffBox.querySelector('.diff-wrap');
    const first = diffBox.querySelector('tr.d-add, tr.d-del, tr.d-chg');
    if (wrap && first) wrap.scrollTop = Math.max(0, first.offsetTop - 90);
    if (b) render(graphBox, layout(nodesOf(b.definition)), { label: `Graph of ${wf.name} v${b.version}` });
    history.replaceState(null, '', `/workflows/${wf.id}?a=${left}&b=${right}`);
  };
  selA.addEventListener('change', draw);
  selB.addEventListener('change', draw);
  main.append(
    h('section', { class: 'card flush', 'aria-labelledby': 'wg' }, h('h2', { id: 'wg', class: 'card-title' }, 'Graph of the right-hand version'), graphBox),
    h('section', { class: 'card', 'aria-labelledby': 'wd' }, h('div', { class: 'card-head' }, h('h2', { id: 'wd' }, 'Compare versions'),
      h('div', { class: 'inline-fields' }, h('label', { for: 'ver-a' }, 'Left'), selA, h('label', { for: 'ver-b' }, 'Right'), selB)), diffBox),
    h('section', { class: 'card flush', 'aria-labelledby': 'wv' }, h('h2', { id: 'wv', class: 'card-title' }, 'Versions'),
      table(['Version', 'Published', 'Nodes'], versions.map((v) => h('tr', null, h('td', null, 'v' + v.version), h('td', null, fmtTime(v.createdAt)),
        h('td', null, String((v.definition.nodes || []).length)))), { caption: 'Versions' })));
  draw();
}

/** diffLines is a longest-common-subsequence line diff: [{op: '=', '-', '+', a, b}]. */
export function diffLines(a, b) {
  const n = a.length, m = b.length;
  const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { out.push({ op: '=', a: a[i++], b: b[j++] }); }
    else if (L[i + 1][j] >= L[i][j + 1]) out.push({ op: '-', a: a[i++] });
    else out.push({ op: '+', b: b[j++] });
  }
  while (i < n) out.push({ op: '-', a: a[i++] });
  while (j < m) out.push({ op: '+', b: b[j++] });
  return out;
}

function sideBySide(va, vb) {
  const a = JSON.stringify(va.definition, null, 2).split('\n');
  const b = JSON.stringify(vb.definition, null, 2).split('\n');
  const ops = diffLines(a, b);
  // Pair runs of removals with the additions that follow them.
  const rows = [];
  let la = 0, lb = 0;
  for (let k = 0; k < ops.length;) {
    if (ops[k].op === '=') { la++; lb++; rows.push(['same', la, ops[k].a, lb, ops[k].b]); k++; continue; }
    const dels = [], adds = [];
    while (k < ops.length && ops[k].op === '-') dels.push(ops[k++].a);
    while (k < ops.length && ops[k].op === '+') adds.push(ops[k++].b);
    for (let x = 0; x < Math.max(dels.length, adds.length); x++) {
      const hasA = x < dels.length, hasB = x < adds.length;
      rows.push([hasA && hasB ? 'chg' : hasA ? 'del' : 'add', hasA ? ++la : '', hasA ? dels[x] : '', hasB ? ++lb : '', hasB ? adds[x] : '']);
    }
  }
  const changed = rows.filter((r) => r[0] !== 'same').length;
  return h('div', null, h('p', { class: 'muted', id: 'diff-summary' }, changed ? `${changed} changed line${changed > 1 ? 's' : ''} between v${va.version} and v${vb.version}.` : `v${va.version} and v${vb.version} are the same.`),
    h('div', { class: 'diff-wrap' }, h('table', { class: 'diff' }, h('caption', { class: 'sr-only' }, `Definition v${va.version} (left) against v${vb.version} (right)`),
      h('colgroup', null, h('col', { class: 'ln' }), h('col'), h('col', { class: 'ln' }), h('col')),
      h('thead', null, h('tr', null, h('th', { scope: 'col', colspan: 2 }, 'v' + va.version), h('th', { scope: 'col', colspan: 2 }, 'v' + vb.version))),
      h('tbody', null, rows.map(([k, na, ta, nb, tb]) => h('tr', { class: 'd-' + k },
        h('td', { class: 'ln' }, na), h('td', { class: 'code a' }, ta), h('td', { class: 'ln' }, nb), h('td', { class: 'code b' }, tb)))))));
}

const SAMPLE = `{
  "description": "Fetches an order, waits for approval, then ships it.",
  "nodes": [
    {"id": "fetch", "type": "http", "http": {"method": "GET", "url": "https://example.com/orders"}},
    {"id": "approve", "type": "wait", "depends_on": ["fetch"], "wait": {"signal": "approval", "approval": true, "timeout": "24h"}},
    {"id": "ship", "type": "noop", "depends_on": ["approve"]}
  ]
}`;

export async function editor(main, ctx) {
  const from = new URLSearchParams(location.search).get('from');
  let wf = null;
  let text = SAMPLE;
  if (from) {
    wf = (await gql(`query($id: ID!) { workflow(id: $id) { id name latestVersion versions(first: 1) { definition } } }`, { id: from })).workflow;
    text = JSON.stringify(wf.versions[0].definition, null, 2);
  }
  const name = h('input', { id: 'wf-name', name: 'name', required: true, value: wf ? wf.name : '', disabled: !!wf, autocomplete: 'off' });
  const desc = h('input', { id: 'wf-desc', name: 'description', value: '', disabled: !!wf, autocomplete: 'off' });
  const area = h('textarea', { id: 'wf-def', name: 'definition', rows: 22, spellcheck: 'false', class: 'code-input' });
  area.value = text;
  const preview = h('div', { class: 'graph', id: 'preview' });
  const status = h('div', { id: 'editor-status', 'aria-live': 'polite' });
  let problems = new Map();
  let graph = null;
  const redraw = () => {
    clear(status);
    try {
      const nodes = nodesOf(area.value);
      const lay = layout(nodes);
      graph = render(preview, lay, { problems, label: 'Preview of the definition' });
      const notes = [];
      for (const u of lay.unknown) notes.push(`“${u.node}” depends on an unknown node “${u.dep}”.`);
      if (lay.cyclic.length) notes.push(`A cycle through ${lay.cyclic.map((x) => `“${x}”`).join(', ')}.`);
      if (notes.length) status.append(h('div', { class: 'warn' }, h('strong', null, 'Before publishing: '), notes.join(' ')));
    } catch (e) {
      graph = null;
      clear(preview).append(empty('No preview: ' + e.message));
    }
  };
  let timer = null;
  area.addEventListener('input', () => { problems = new Map(); clearTimeout(timer); timer = setTimeout(redraw, 150); });
  const submit = async (ev) => {
    ev.preventDefault();
    // A preview still due from typing would clear the answer's problems.
    clearTimeout(timer);
    let def;
    try { def = JSON.parse(area.value); } catch (e) { clear(status).append(h('div', { class: 'error', role: 'alert' }, 'The definition is not valid JSON: ' + e.message)); return; }
    try {
      if (wf) {
        const d = await gql(`mutation($w: ID!, $d: JSON!) { publishWorkflowVersion(workflowId: $w, definition: $d) { version } }`, { w: wf.id, d: def });
        toast(`Published v${d.publishWorkflowVersion.version}.`);
        ctx.navigate(`/workflows/${wf.id}?a=${d.publishWorkflowVersion.version - 1}&b=${d.publishWorkflowVersion.version}`);
      } else {
        const d = await gql(`mutation($in: CreateWorkflowInput!) { createWorkflow(input: $in) { workflow { id } } }`, { in: { name: name.value, description: desc.value, definition: def } });
        toast('Workflow created.');
        ctx.navigate('/workflows/' + d.createWorkflow.workflow.id);
      }
    } catch (e) {
      problems = new Map();
      for (const p of e.problems || []) if (p.node) problems.set(p.node, [...(problems.get(p.node) || []), `${p.field ? p.field + ': ' : ''}${p.message}`]);
      redraw();
      status.append(errorBox(e));
    }
  };
  main.append(h('div', { class: 'page-head' }, h('div', null, h('div', { class: 'crumbs' }, h('a', { href: '/workflows' }, 'Workflows')),
    h('h1', null, wf ? `Publish ${wf.name} v${wf.latestVersion + 1}` : 'New workflow'))),
  h('form', { class: 'editor', onsubmit: submit },
    h('div', { class: 'card' },
      h('div', { class: 'field' }, h('label', { for: 'wf-name' }, 'Name'), name),
      h('div', { class: 'field' }, h('label', { for: 'wf-desc' }, 'Description'), desc),
      h('div', { class: 'field' }, h('label', { for: 'wf-def' }, 'Definition (JSON)'), area),
      h('div', { class: 'actions' }, ctx.can('workflows:write') ? h('button', { class: 'btn primary', type: 'submit', id: 'wf-submit' }, wf ? 'Publish' : 'Create') : null)),
    h('div', { class: 'card flush' }, h('h2', { class: 'card-title' }, 'Preview'), preview, h('div', { class: 'pad' }, status))));
  redraw();
}
