// Stats: runs started, completed and failed per bucket (bars) with p50 and
// p95 durations (lines), drawn as hand-written SVG from runStats. A server
// without runStats answers GRAPHQL_VALIDATION_FAILED: the page says so.

import { gql } from './api.js';
import { h, s, clear, errorBox, fmtDuration, table } from './ui.js';

const RANGES = { '1h': [3600e3, 'MINUTE'], '24h': [86400e3, 'HOUR'], '7d': [7 * 86400e3, 'DAY'], '30d': [30 * 86400e3, 'DAY'] };

export async function page(main) {
  const wfs = await gql(`{ workflows(first: 100) { edges { node { id name } } } }`).then((d) => d.workflows.edges.map((e) => e.node)).catch(() => []);
  const q = new URLSearchParams(location.search);
  const range = h('select', { id: 'st-range' }, Object.keys(RANGES).map((k) => h('option', { value: k }, 'Last ' + k)));
  range.value = RANGES[q.get('range')] ? q.get('range') : '24h';
  const wf = h('select', { id: 'st-workflow' }, h('option', { value: '' }, 'All workflows'), wfs.map((w) => h('option', { value: w.id }, w.name)));
  wf.value = q.get('workflow') || '';
  const out = h('div', { id: 'stats' });
  main.append(h('div', { class: 'page-head' }, h('h1', null, 'Stats'),
    h('div', { class: 'inline-fields' }, h('label', { for: 'st-range' }, 'Range'), range, h('label', { for: 'st-workflow' }, 'Workflow'), wf)), out);
  // A load overtaken by a newer one (the range changed twice) draws nothing.
  let latest = 0;
  const load = async () => {
    const mine = ++latest;
    const [span, interval] = RANGES[range.value];
    const to = new Date();
    const from = new Date(to.getTime() - span);
    history.replaceState(null, '', `/stats?range=${range.value}${wf.value ? '&workflow=' + wf.value : ''}`);
    clear(out).append(h('p', { class: 'muted' }, 'Loading…'));
    try {
      const d = await gql(`query($w: ID, $f: Time!, $t: Time!, $i: StatsInterval!) { runStats(workflowId: $w, from: $f, to: $t, interval: $i) {
        interval from to buckets { start started completed failed cancelled p50Ms p95Ms failureRate } } }`,
      { w: wf.value || null, f: from.toISOString(), t: to.toISOString(), i: interval });
      if (mine !== latest) return;
      clear(out).append(chart(d.runStats), summary(d.runStats));
    } catch (e) {
      if (mine !== latest) return;
      clear(out);
      if (e.code === 'GRAPHQL_VALIDATION_FAILED') {
        out.append(h('div', { class: 'callout', id: 'stats-unavailable' }, h('h2', null, 'Stats are not available on this server'),
          h('p', null, 'This server\u2019s API has no runStats query yet (the request was refused with GRAPHQL_VALIDATION_FAILED). Upgrade the server to see runs started, completed and failed over time.')));
      } else out.append(errorBox(e));
    }
  };
  range.addEventListener('change', load);
  wf.addEventListener('change', load);
  await load();
}

function label(t, interval) {
  const d = new Date(t);
  if (interval === 'DAY') return d.toLocaleDateString(undefined, { month: 'short', day: 'numeric' });
  return d.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit' });
}

export function chart(st) {
  const b = st.buckets;
  const W = 960, H = 300, L = 48, R = 56, T = 16, B = 36;
  const iw = W - L - R, ih = H - T - B;
  const maxN = Math.max(1, ...b.map((x) => Math.max(x.started, x.completed + x.failed)));
  const maxMs = Math.max(1, ...b.map((x) => x.p95Ms || 0));
  const bw = iw / Math.max(1, b.length);
  const y = (n) => T + ih - (n / maxN) * ih;
  const ym = (ms) => T + ih - (ms / maxMs) * ih;
  const svg = s('svg', { class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': 'chart-title chart-desc' },
    s('title', { id: 'chart-title' }, 'Runs per bucket and their durations'),
    s('desc', { id: 'chart-desc' }, `${b.length} buckets; bars: started, completed, failed; lines: p50 and p95 duration.`));
  for (let k = 0; k <= 4; k++) {
    const v = Math.round((maxN * k) / 4);
    svg.append(s('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), class: 'grid' }), s('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, v));
    svg.append(s('text', { x: W - R + 6, y: ym((maxMs * k) / 4) + 4, class: 'axis' }, fmtDuration((maxMs * k) / 4)));
  }
  const step = Math.max(1, Math.ceil(b.length / 12));
  b.forEach((x, i) => {
    const x0 = L + i * bw, w = Math.max(1, bw / 3 - 1);
    svg.append(
      s('rect', { x: x0 + 1, y: y(x.started), width: w, height: T + ih - y(x.started), class: 'bar started' }, s('title', null, `${label(x.start, st.interval)}: ${x.started} started`)),
      s('rect', { x: x0 + 1 + w, y: y(x.completed), width: w, height: T + ih - y(x.completed), class: 'bar completed' }, s('title', null, `${x.completed} completed`)),
      s('rect', { x: x0 + 1 + 2 * w, y: y(x.failed), width: w, height: T + ih - y(x.failed), class: 'bar failed' }, s('title', null, `${x.failed} failed`)));
    if (i % step === 0) svg.append(s('text', { x: x0 + bw / 2, y: H - 14, 'text-anchor': 'middle', class: 'axis' }, label(x.start, st.interval)));
  });
  for (const [key, cls] of [['p50Ms', 'p50'], ['p95Ms', 'p95']]) {
    const pts = b.map((x, i) => (x[key] === null || x[key] === undefined ? null : `${L + i * bw + bw / 2},${ym(x[key])}`)).filter(Boolean);
    if (pts.length) svg.append(s('polyline', { points: pts.join(' '), class: 'line ' + cls }));
  }
  const legend = h('div', { class: 'chart-legend' }, [['started', 'Started'], ['completed', 'Completed'], ['failed', 'Failed'], ['p50', 'p50 duration'], ['p95', 'p95 duration']]
    .map(([c, t]) => h('span', { class: 'lg-' + c }, t)));
  return h('section', { class: 'card', 'aria-label': 'Chart' }, legend, svg);
}

function summary(st) {
  const b = st.buckets;
  const sum = (k) => b.reduce((a, x) => a + x[k], 0);
  return h('section', { class: 'card flush', 'aria-label': 'Buckets' }, h('div', { class: 'stat-row pad' },
    [['Started', sum('started')], ['Completed', sum('completed')], ['Failed', sum('failed')], ['Cancelled', sum('cancelled')]].map(([k, v]) =>
      h('div', { class: 'stat' }, h('span', { class: 'n' }, String(v)), h('span', { class: 'l' }, k)))),
  table(['Bucket', 'Started', 'Completed', 'Failed', 'Cancelled', 'p50', 'p95', 'Failure rate'], b.filter((x) => x.started || x.completed || x.failed || x.cancelled).reverse().slice(0, 50).map((x) => h('tr', null,
    h('td', null, new Date(x.start).toLocaleString()), h('td', null, x.started), h('td', null, x.completed), h('td', null, x.failed), h('td', null, x.cancelled),
    h('td', null, fmtDuration(x.p50Ms)), h('td', null, fmtDuration(x.p95Ms)), h('td', null, (x.failureRate * 100).toFixed(1) + ' %'))), { caption: 'Buckets with runs' }));
}
