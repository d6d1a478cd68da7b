// Drawing a workflow's DAG as SVG: layers by topological depth (the
// longest path from a root), left to right, each layer ordered by the mean
// position of its parents to keep edges short. Pure layout, then one pass
// to build the SVG; update() recolours nodes without laying out again.

import { s, clear } from './ui.js';

const W = 168, H = 46, GX = 64, GY = 18, PAD = 16;

/** layout places nodes [{id, depends_on}] and reports cycles and unknown deps. */
export function layout(nodes) {
  const byId = new Map();
  for (const n of nodes) if (n && typeof n.id === 'string' && !byId.has(n.id)) byId.set(n.id, n);
  const ids = [...byId.keys()];
  const parents = new Map(ids.map((id) => [id, []]));
  const children = new Map(ids.map((id) => [id, []]));
  const unknown = [];
  for (const id of ids) {
    for (const d of byId.get(id).depends_on || []) {
      if (!byId.has(d)) { unknown.push({ node: id, dep: d }); continue; }
      parents.get(id).push(d);
      children.get(d).push(id);
    }
  }
  // Kahn's algorithm; depth = 1 + the deepest parent.
  const indeg = new Map(ids.map((id) => [id, parents.get(id).length]));
  const depth = new Map();
  const queue = ids.filter((id) => indeg.get(id) === 0);
  for (const id of queue) depth.set(id, 0);
  for (let i = 0; i < queue.length; i++) {
    const id = queue[i];
    for (const c of children.get(id)) {
      depth.set(c, Math.max(depth.get(c) || 0, depth.get(id) + 1));
      indeg.set(c, indeg.get(c) - 1);
      if (indeg.get(c) === 0) queue.push(c);
    }
  }
  const cyclic = ids.filter((id) => !depth.has(id) || indeg.get(id) > 0);
  let maxDepth = 0;
  for (const d of depth.values()) maxDepth = Math.max(maxDepth, d);
  for (const id of cyclic) depth.set(id, maxDepth + 1);
  const layers = [];
  for (const id of ids) {
    const d = depth.get(id);
    (layers[d] = layers[d] || []).push(id);
  }
  const pos = new Map();
  layers.forEach((layer, d) => {
    if (d > 0) {
      const mean = (id) => {
        const ps = parents.get(id).filter((p) => pos.has(p));
        return ps.length ? ps.reduce((a, p) => a + pos.get(p).row, 0) / ps.length : 0;
      };
      const keys = new Map(layer.map((id) => [id, mean(id)]));
      layer.sort((a, b) => keys.get(a) - keys.get(b));
    }
    layer.forEach((id, row) => pos.set(id, { row, col: d }));
  });
  const rows = Math.max(1, ...layers.map((l) => (l ? l.length : 0)));
  // Centre each layer vertically.
  for (const layer of layers) {
    if (!layer) continue;
    const off = (rows - layer.length) / 2;
    for (const id of layer) {
      const p = pos.get(id);
      p.x = PAD + p.col * (W + GX);
      p.y = PAD + (p.row + off) * (H + GY);
    }
  }
  const edges = [];
  for (const id of ids) for (const p of parents.get(id)) edges.push([p, id]);
  return {
    ids, byId, pos, edges, cyclic, unknown,
    width: PAD * 2 + layers.length * W + Math.max(0, layers.length - 1) * GX,
    height: PAD * 2 + rows * H + (rows - 1) * GY,
  };
}


/**
 * render draws the layout into container and returns {update(states), select(id)}.
 * states: Map nodeId -> {state, attempt, maxAttempts}; problems: Map nodeId -> [messages].
 * onSelect(id) is called when a node is clicked or activated with the keyboard.
 */
export function render(container, lay, { states = new Map(), problems = new Map(), onSelect, label = 'Workflow graph' } = {}) {
  clear(container);
  const svg = s('svg', { class: 'dag', width: lay.width, height: lay.height, viewBox: `0 0 ${lay.width} ${lay.height}`, role: 'group', 'aria-label': label });
  const defs = s('defs', null, s('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
    s('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrowhead' })));
  svg.append(defs);
  const edgeG = s('g', { class: 'edges', 'aria-hidden': 'true' });
  for (const [a, b] of lay.edges) {
    const p = lay.pos.get(a), q = lay.pos.get(b);
    const x1 = p.x + W, y1 = p.y + H / 2, x2 = q.x - 2, y2 = q.y + H / 2;
    const mx = (x1 + x2) / 2;
    edgeG.append(s('path', { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, class: 'edge', 'marker-end': 'url(#arrow)', 'data-from': a, 'data-to': b }));
  }
  svg.append(edgeG);
  const nodeEls = new Map();
  const nodeG = s('g', { class: 'nodes' });
  for (const id of lay.ids) {
    const p = lay.pos.get(id);
    const n = lay.byId.get(id);
    const g = s('g', { class: 'node', transform: `translate(${p.x},${p.y})`, tabindex: 0, role: 'button', 'data-node': id });
    const title = s('title');
    g.append(title,
      s('rect', { width: W, height: H, rx: 8, class: 'box' }),
      s('rect', { width: 5, height: H, rx: 2, class: 'bar' }),
      s('text', { x: 14, y: 19, class: 'nid' }, truncate(id, 19)),
      s('text', { x: 14, y: 35, class: 'ntype' }, n.type || '?'),
      s('text', { x: W - 10, y: 35, class: 'nattempt', 'text-anchor': 'end' }, ''));
    const activate = () => onSelect && onSelect(id);
    g.addEventListener('click', activate);
    g.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); activate(); }
      else if (ev.key.startsWith('Arrow')) { ev.preventDefault(); moveFocus(lay, nodeEls, id, ev.key); }
    });
    nodeEls.set(id, { g, title, attempt: g.lastChild, type: n.type });
    nodeG.append(g);
  }
  svg.append(nodeG);
  container.append(svg);
  const api = {
    update(st, pr = problems) {
      for (const [id, el] of nodeEls) {
        const t = st.get(id);
        const state = t ? String(t.state).toLowerCase() : 'none';
        const probs = pr.get(id) || [];
        el.g.setAttribute('class', `node s-${state}${probs.length ? ' problem' : ''}${lay.cyclic.includes(id) ? ' problem' : ''}`);
        el.g.dataset.state = state;
        el.attempt.textContent = t && t.attempt ? `attempt ${t.attempt}/${t.maxAttempts || t.attempt}` : '';
        const words = [`${id} (${el.type})`, t ? state : 'not started'];
        if (t && t.attempt) words.push(`attempt ${t.attempt} of ${t.maxAttempts}`);
        for (const m of probs) words.push('problem: ' + m);
        el.title.textContent = words.join(', ');
        el.g.setAttribute('aria-label', words.join(', '));
      }
    },
    select(id) {
      for (const [nid, el] of nodeEls) el.g.classList.toggle('selected', nid === id);
    },
  };
  api.update(states, problems);
  return api;
}

function truncate(t, n) { return t.length > n ? t.slice(0, n - 1) + '…' : t; }

function moveFocus(lay, els, id, key) {
  const p = lay.pos.get(id);
  let best = null, bestD = Infinity;
  for (const [other, q] of lay.pos) {
    if (other === id) continue;
    const dx = q.x - p.x, dy = q.y - p.y;
    const ok = key === 'ArrowRight' ? dx > 0 : key === 'ArrowLeft' ? dx < 0 : key === 'ArrowDown' ? dy > 0 && Math.abs(dx) < W : dy < 0 && Math.abs(dx) < W;
    if (!ok) continue;
    const d = Math.abs(dx) + Math.abs(dy) * 1.5;
    if (d < bestD) { bestD = d; best = other; }
  }
  if (best) els.get(best).g.focus();
}

/** nodesOf returns the nodes of a definition (JSON object or string), or throws. */
export function nodesOf(def) {
  const d = typeof def === 'string' ? JSON.parse(def) : def;
  if (!d || !Array.isArray(d.nodes)) throw new Error('a definition needs a "nodes" array');
  return d.nodes.filter((n) => n && typeof n === 'object');
}
