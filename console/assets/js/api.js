// The console's only way to the server: the public GraphQL API over HTTP
// (queries, mutations) and graphql-transport-ws (subscriptions). The
// credential lives in sessionStorage, is sent in the Authorization header
// (and in the websocket's connection_init payload), never in a URL.

const KEY = 'composer.credential';

export function credential() { return sessionStorage.getItem(KEY) || ''; }
export function setCredential(c) { sessionStorage.setItem(KEY, c.trim().replace(/^Bearer\s+/i, '')); }

let onSignedOut = () => {};
/** onSignOut registers what happens when the credential stops working. */
export function onSignOut(fn) { onSignedOut = fn; }

export function signOut(reason) {
  sessionStorage.removeItem(KEY);
  closeSocket();
  onSignedOut(reason);
}

/** GraphQLError carries the stable extensions.code of the first error. */
export class GraphQLError extends Error {
  constructor(errors) {
    const first = errors[0] || {};
    super(first.message || 'request failed');
    this.code = (first.extensions && first.extensions.code) || 'INTERNAL';
    this.problems = (first.extensions && first.extensions.problems) || [];
    this.errors = errors;
  }
}

/** gql runs a query or mutation and returns its data, or throws GraphQLError. */
export async function gql(query, variables = {}) {
  let resp;
  try {
    resp = await fetch('/graphql', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + credential() },
      body: JSON.stringify({ query, variables }),
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (e) {
    throw new GraphQLError([{ message: 'the server cannot be reached', extensions: { code: 'NETWORK_ERROR' } }]);
  }
  let body;
  try { body = await resp.json(); } catch (e) {
    throw new GraphQLError([{ message: `HTTP ${resp.status}`, extensions: { code: resp.status === 413 ? 'PAYLOAD_TOO_LARGE' : 'INTERNAL' } }]);
  }
  if (body.errors && body.errors.length) {
    const err = new GraphQLError(body.errors);
    if (err.code === 'UNAUTHENTICATED') signOut('Your credential expired or was revoked: sign in again.');
    throw err;
  }
  return body.data;
}

// One websocket for every subscription of the page, opened on first use.
let socket = null;
let acked = false;
let nextId = 1;
const subs = new Map(); // id -> {payload, next, error}

function closeSocket() {
  if (socket) { const s = socket; socket = null; s.onclose = null; s.close(1000); }
  acked = false;
}

function send(msg) { if (socket && socket.readyState === 1) socket.send(JSON.stringify(msg)); }

function open() {
  if (socket) return;
  const url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/graphql';
  const ws = new WebSocket(url, 'graphql-transport-ws');
  socket = ws;
  acked = false;
  ws.onopen = () => send({ type: 'connection_init', payload: { Authorization: 'Bearer ' + credential() } });
  ws.onmessage = (ev) => {
    let m;
    try { m = JSON.parse(ev.data); } catch { return; }
    switch (m.type) {
      case 'connection_ack':
        acked = true;
        for (const [id, s] of subs) send({ id, type: 'subscribe', payload: s.payload });
        break;
      case 'ping': send({ type: 'pong' }); break;
      case 'next': {
        const s = subs.get(m.id);
        if (!s) break;
        if (m.payload.errors && m.payload.errors.length) s.error(new GraphQLError(m.payload.errors));
        else s.next(m.payload.data);
        break;
      }
      case 'error': {
        const s = subs.get(m.id);
        if (s) { subs.delete(m.id); s.error(new GraphQLError(m.payload || [])); }
        break;
      }
      case 'complete': {
        const s = subs.get(m.id);
        if (s) { subs.delete(m.id); s.complete && s.complete(); }
        break;
      }
    }
  };
  ws.onclose = (ev) => {
    if (socket !== ws) return;
    socket = null;
    acked = false;
    // 4401/4403: the credential no longer authenticates (revoked key,
    // removed member, expired token): back to sign-in.
    if (ev.code === 4401 || ev.code === 4403) { signOut('Your credential expired or was revoked: sign in again.'); return; }
    if (subs.size) setTimeout(() => { if (!socket && subs.size && credential()) open(); }, 1000 + Math.random() * 1000);
  };
}

/**
 * subscribe starts a subscription; next receives each payload's data.
 * It returns a function that ends it.
 */
export function subscribe(query, variables, next, error = () => {}, complete) {
  const id = String(nextId++);
  const payload = { query, variables };
  subs.set(id, { payload, next, error, complete });
  open();
  if (acked) send({ id, type: 'subscribe', payload });
  return () => {
    if (subs.delete(id)) send({ id, type: 'complete' });
    if (!subs.size) closeSocket();
  };
}

/** endAll ends every subscription (on navigation). */
export function endAll() {
  for (const id of subs.keys()) send({ id, type: 'complete' });
  subs.clear();
  closeSocket();
}
