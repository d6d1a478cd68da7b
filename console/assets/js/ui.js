// Small DOM helpers: an element builder, formatting, error boxes and a
// confirmation dialog. No framework: each page builds its DOM and updates
// the parts that change.

/** h builds an element: h('a', {href: '/x', class: 'btn'}, 'text', child). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.className = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k === 'value') el.value = v;
      else if (k === 'checked') el.checked = !!v;
      else el.setAttribute(k, v === true ? '' : v);
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export const SVGNS = 'http://www.w3.org/2000/svg';
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVGNS, tag);
  if (attrs) for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, v);
  for (const c of children) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

export function clear(el) { while (el.firstChild) el.firstChild.remove(); return el; }

export function fmtTime(t) {
  if (!t) return '—';
  const d = new Date(t);
  return d.toLocaleString(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined || isNaN(ms)) return '—';
  if (ms < 1000) return Math.round(ms) + ' ms';
  const sec = ms / 1000;
  if (sec < 60) return sec.toFixed(sec < 10 ? 2 : 1) + ' s';
  const m = Math.floor(sec / 60);
  if (m < 60) return `${m} min ${Math.round(sec % 60)} s`;
  const hr = Math.floor(m / 60);
  return `${hr} h ${m % 60} min`;
}

export function since(a, b) {
  if (!a) return null;
  return (b ? new Date(b) : new Date()) - new Date(a);
}

export function shortId(id) { return id ? id.slice(-8) : ''; }

export function json(v) { return JSON.stringify(v, null, 2); }

export function status(st) {
  const s = String(st || '').toLowerCase();
  return h('span', { class: 'badge st-' + s }, s);
}

// What each error code means, in words.
const CODES = {
  UNAUTHENTICATED: 'Not signed in: the credential is missing, expired or revoked',
  FORBIDDEN: 'Not allowed: your role or key scopes do not permit this',
  NOT_FOUND: 'Not found in this tenant',
  BAD_USER_INPUT: 'The input is not valid',
  CONFLICT: 'Conflicts with the current state',
  RATE_LIMITED: 'Too many requests: try again shortly',
  QUOTA_EXCEEDED: 'A limit of your plan is reached',
  INTERNAL: 'The server failed to answer',
  GRAPHQL_VALIDATION_FAILED: 'This server does not offer this query',
  GRAPHQL_PARSE_FAILED: 'The query could not be parsed',
  COMPLEXITY_LIMIT_EXCEEDED: 'The query asks for too much at once',
  RESPONSE_TOO_LARGE: 'The answer would be too large',
  NETWORK_ERROR: 'The server cannot be reached',
};

export function codeInWords(code) { return CODES[code] || 'The request failed'; }

/** errorBox shows an error with its extensions.code in words. */
export function errorBox(err) {
  const code = err && err.code ? err.code : 'INTERNAL';
  return h('div', { class: 'error', role: 'alert' },
    h('strong', null, codeInWords(code)), ' ', h('code', null, code),
    err && err.message ? h('div', { class: 'error-msg' }, err.message) : null,
    err && err.problems && err.problems.length ? h('ul', null, err.problems.map((p) =>
      h('li', null, p.node ? h('code', null, p.node) : null, p.field ? ` ${p.field}` : '', ': ', p.message))) : null);
}

/** toast shows a short message at the bottom of the page. */
export function toast(msg, kind = 'ok') {
  let area = document.getElementById('toasts');
  if (!area) { area = h('div', { id: 'toasts', role: 'status', 'aria-live': 'polite' }); document.body.append(area); }
  const t = h('div', { class: 'toast ' + kind }, msg);
  area.append(t);
  setTimeout(() => t.remove(), 4000);
}

/**
 * ask opens a modal dialog and resolves to the form's values, or null when
 * dismissed. fields: [{name, label, type: 'text'|'textarea'|'select'|'checkboxes', options, value, required}].
 */
export function ask({ title, body, fields = [], confirm = 'Confirm', danger = false }) {
  return new Promise((resolve) => {
    const form = h('form', { method: 'dialog', class: 'dialog-form' });
    const inputs = {};
    for (const f of fields) {
      const id = 'f-' + f.name;
      let input;
      if (f.type === 'textarea') input = h('textarea', { id, name: f.name, rows: f.rows || 6, required: f.required, spellcheck: 'false' });
      else if (f.type === 'select') input = h('select', { id, name: f.name }, f.options.map((o) => h('option', { value: o.value }, o.label)));
      else if (f.type === 'checkboxes') {
        input = h('fieldset', { class: 'checks' }, h('legend', null, f.label),
          f.options.map((o) => h('label', null, h('input', { type: 'checkbox', name: f.name, value: o, checked: (f.value || []).includes(o) }), ' ', o)));
      } else input = h('input', { id, name: f.name, type: f.type || 'text', required: f.required, autocomplete: 'off', placeholder: f.placeholder });
      if (f.value !== undefined && f.type !== 'checkboxes') input.value = f.value;
      inputs[f.name] = input;
      form.append(f.type === 'checkboxes' ? input : h('div', { class: 'field' }, h('label', { for: id }, f.label), input));
    }
    const dlg = h('dialog', { class: 'dialog', 'aria-labelledby': 'dlg-title' },
      h('h2', { id: 'dlg-title' }, title), body ? h('p', null, body) : null, form);
    const errArea = h('div');
    form.append(errArea, h('div', { class: 'actions' },
      h('button', { type: 'button', class: 'btn', onclick: () => { dlg.close(); } }, 'Cancel'),
      h('button', { type: 'submit', class: 'btn ' + (danger ? 'danger' : 'primary'), value: 'ok' }, confirm)));
    let result = null;
    form.addEventListener('submit', (ev) => {
      const values = {};
      for (const f of fields) {
        if (f.type === 'checkboxes') values[f.name] = [...inputs[f.name].querySelectorAll('input:checked')].map((i) => i.value);
        else values[f.name] = inputs[f.name].value;
      }
      if (fields.some((f) => f.type === 'textarea' && f.json)) {
        for (const f of fields.filter((f) => f.json)) {
          try { values[f.name] = values[f.name].trim() ? JSON.parse(values[f.name]) : null; } catch (e) {
            ev.preventDefault();
            clear(errArea).append(h('div', { class: 'error', role: 'alert' }, `${f.label}: not valid JSON (${e.message})`));
            return;
          }
        }
      }
      result = values;
    });
    dlg.addEventListener('close', () => { dlg.remove(); resolve(result); });
    document.body.append(dlg);
    dlg.showModal();
  });
}

/** showOnce shows a secret that is never shown again, with a copy button. */
export function showOnce(title, secret) {
  const code = h('code', { class: 'secret' }, secret);
  const dlg = h('dialog', { class: 'dialog', 'aria-labelledby': 'once-title' },
    h('h2', { id: 'once-title' }, title),
    h('p', null, 'Copy it now: it is shown this once and never again.'), code,
    h('div', { class: 'actions' },
      h('button', { class: 'btn', onclick: () => navigator.clipboard && navigator.clipboard.writeText(secret) }, 'Copy'),
      h('button', { class: 'btn primary', onclick: () => dlg.close() }, 'Done')));
  dlg.addEventListener('close', () => dlg.remove());
  document.body.append(dlg);
  dlg.showModal();
}

export function table(headers, rows, opts = {}) {
  return h('table', { class: 'table' + (opts.class ? ' ' + opts.class : '') },
    opts.caption ? h('caption', { class: 'sr-only' }, opts.caption) : null,
    h('thead', null, h('tr', null, headers.map((x) => h('th', { scope: 'col' }, x)))),
    h('tbody', null, rows));
}

export function empty(msg) { return h('p', { class: 'empty' }, msg); }

export function pre(v) { return h('pre', { class: 'json' }, v === undefined || v === null ? '—' : json(v)); }

/** fail reports a failed action: its code in words, the code, the message. */
export function fail(e) { toast(`${codeInWords(e.code)} (${e.code}): ${e.message}`, 'err'); }
