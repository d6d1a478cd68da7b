// The console's shell: sign-in, the layout (header, navigation, main
// landmark), the router (history API; the server answers every page path
// with index.html) and what the viewer may do.

import { gql, credential, setCredential, onSignOut, signOut, endAll } from './api.js';
import { h, clear, errorBox } from './ui.js';

const routes = [
  [/^\/runs\/?$/, () => import('./runs.js'), 'runs'],
  [/^\/runs\/([^/]+)$/, () => import('./run.js'), 'runs'],
  [/^\/workflows\/?$/, () => import('./workflows.js'), 'workflows'],
  [/^\/workflows\/new$/, () => import('./workflows.js').then((m) => ({ page: m.editor })), 'workflows'],
  [/^\/workflows\/([^/]+)$/, () => import('./workflows.js').then((m) => ({ page: m.detail })), 'workflows'],
  [/^\/stats\/?$/, () => import('./stats.js'), 'stats'],
  [/^\/admin\/(keys|members|webhooks|usage)$/, () => import('./admin.js'), 'admin'],
];

const NAV = [
  ['/runs', 'Runs', 'runs', 'runs:read'],
  ['/workflows', 'Workflows', 'workflows', 'workflows:read'],
  ['/stats', 'Stats', 'stats', 'runs:read'],
  ['/admin/keys', 'Admin', 'admin', null],
];

const app = document.getElementById('app');
let viewer = null;
let cleanup = null;
let signOutReason = '';

const ctx = {
  get viewer() { return viewer; },
  can: (perm) => !!viewer && viewer.permissions.includes(perm),
  navigate,
};
window.composer = { navigate, ctx };

onSignOut((reason) => {
  viewer = null;
  signOutReason = reason || '';
  navigate('/signin', true);
});

export function navigate(path, replace = false) {
  if (replace) history.replaceState(null, '', path);
  else history.pushState(null, '', path);
  route();
}

document.addEventListener('click', (ev) => {
  const a = ev.target.closest && ev.target.closest('a[href]');
  if (!a || a.target || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.button !== 0) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith('/graphql')) return;
  ev.preventDefault();
  navigate(url.pathname + url.search);
});
window.addEventListener('popstate', route);

const VIEWER = `{ viewer { subject kind role scopes permissions tenant { id name plan } } }`;

async function loadViewer() {
  const d = await gql(VIEWER);
  viewer = d.viewer;
}

let generation = 0;

function runCleanup(fn) { try { fn(); } catch { /* a page's cleanup must not stop navigation */ } }

async function route() {
  const gen = ++generation;
  if (cleanup) { runCleanup(cleanup); cleanup = null; }
  endAll();
  const path = location.pathname;
  if (!credential()) { if (path !== '/signin') history.replaceState(null, '', '/signin'); return signin(); }
  if (path === '/signin') { history.replaceState(null, '', '/runs'); return route(); }
  if (!viewer) {
    try { await loadViewer(); } catch (e) { if (!credential()) return; return shell(null, (main) => main.append(errorBox(e))); }
  }
  if (path === '/' || path === '') { history.replaceState(null, '', '/runs'); return route(); }
  for (const [re, load, section] of routes) {
    const m = path.match(re);
    if (!m) continue;
    return shell(section, async (main) => {
      const mod = await load();
      const params = m.slice(1).map(decodeURIComponent);
      const done = (await mod.page(main, ctx, ...params)) || null;
      // A page that finished loading after the next navigation ends at once.
      if (gen !== generation) { if (done) runCleanup(done); return; }
      cleanup = done;
    });
  }
  return shell(null, (main) => main.append(h('h1', null, 'Not found'), h('p', null, h('a', { href: '/runs' }, 'Back to runs'))));
}

async function shell(section, fill) {
  const main = h('main', { id: 'main', tabindex: '-1' });
  const adminTab = ['keys:manage', 'members:manage', 'webhooks:manage'].find((p) => ctx.can(p));
  const adminHref = adminTab ? '/admin/' + { 'keys:manage': 'keys', 'members:manage': 'members', 'webhooks:manage': 'webhooks' }[adminTab] : '/admin/usage';
  const nav = h('nav', { 'aria-label': 'Main' }, h('ul', null, NAV.filter(([, , , p]) => !p || ctx.can(p)).map(([href, label, sec]) =>
    h('li', null, h('a', { href: sec === 'admin' ? adminHref : href, 'aria-current': sec === section ? 'page' : null }, label)))));
  const who = viewer ? h('div', { class: 'who' },
    h('span', { class: 'tenant', title: viewer.tenant.id }, viewer.tenant.name),
    h('span', { class: 'subject' }, viewer.kind === 'USER' ? `${viewer.subject} · ${String(viewer.role).toLowerCase()}` : `API key ${viewer.subject}`),
    h('button', { class: 'btn small', id: 'signout', onclick: () => signOut('Signed out.') }, 'Sign out')) : null;
  const header = h('header', { class: 'top' },
    h('a', { class: 'brand', href: '/runs' }, h('img', { src: '/favicon.svg', alt: '', width: 22, height: 22 }), 'Composer'), nav, who);
  clear(app).append(header, main);
  try { await fill(main); } catch (e) { main.append(errorBox(e)); }
}

async function signin() {
  clear(app);
  const input = h('textarea', { id: 'credential', name: 'credential', rows: 3, required: true, spellcheck: 'false', autocomplete: 'off',
    placeholder: 'cmp_… or eyJ…', 'aria-describedby': 'cred-help' });
  const errArea = h('div', { 'aria-live': 'assertive' });
  const submit = async (cred) => {
    setCredential(cred);
    viewer = null;
    try {
      await loadViewer();
      signOutReason = '';
      navigate('/runs', true);
    } catch (e) {
      sessionStorage.removeItem('composer.credential');
      clear(errArea).append(errorBox(e));
    }
  };
  const form = h('form', { class: 'card signin-card', onsubmit: (ev) => { ev.preventDefault(); submit(input.value); } },
    h('h1', null, h('img', { src: '/favicon.svg', alt: '', width: 28, height: 28 }), ' Sign in to Composer'),
    signOutReason ? h('p', { class: 'notice', role: 'status' }, signOutReason) : null,
    h('label', { for: 'credential' }, 'API key or user token'),
    input,
    h('p', { id: 'cred-help', class: 'muted' }, 'Kept in this tab only (sessionStorage) and sent in the Authorization header, never in a URL.'),
    h('button', { class: 'btn primary', type: 'submit', id: 'signin-submit' }, 'Sign in'),
    errArea);
  const main = h('main', { id: 'main', class: 'signin' }, form);
  app.append(main);
  // Under `composer dev` a development-only endpoint mints the demo owner's token.
  try {
    const r = await fetch('/v1/dev/session', { cache: 'no-store' });
    if (r.ok) {
      const info = await r.json();
      form.append(h('div', { class: 'divider' }, 'development'), h('button', {
        class: 'btn', type: 'button', id: 'demo-signin', onclick: async () => {
          const t = await fetch('/v1/dev/session', { method: 'POST', cache: 'no-store' });
          if (!t.ok) { clear(errArea).append(errorBox({ code: 'INTERNAL', message: `HTTP ${t.status}` })); return; }
          submit((await t.json()).token);
        },
      }, `Sign in as the demo owner (${info.subject})`));
    }
  } catch { /* not composer dev */ }
  input.focus();
}

// The credential is asked about now and then while the console is open:
// an expired token or a revoked key signs out (gql does on UNAUTHENTICATED)
// even on a page without live updates, or when the socket that would have
// been closed (4401) was between reconnects.
setInterval(() => {
  if (credential() && viewer && document.visibilityState === 'visible') gql(`{ viewer { kind } }`).catch(() => {});
}, 10000);

route();
