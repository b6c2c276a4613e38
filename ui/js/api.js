// The API client. Same origin, the session cookie (HttpOnly) travels by itself; every write carries
// the CSRF token that the login (or /auth/me) returned, in the header the API requires.
export const BASE = '/api/v1';
export const CSRF_HEADER = 'X-CSRF-Token';
// Every request has a deadline: a frozen API (SIGSTOP, a hung proxy) keeps the connection open and
// answers nothing, and a fetch without one waits for ever (decision 0144).
export const REQUEST_TIMEOUT_MS = 8000;

let csrfToken = sessionStorage.getItem('scrinalia.csrf') || null;
let clockOffset = 0; // server clock minus ours, from the Date header (second resolution is enough)
const unauthorisedHandlers = [];

export function setCsrf(token) {
  csrfToken = token || null;
  if (csrfToken) sessionStorage.setItem('scrinalia.csrf', csrfToken);
  else sessionStorage.removeItem('scrinalia.csrf');
}

export function onUnauthorised(fn) { unauthorisedHandlers.push(fn); }

/** Now, by the server's clock: ETAs and "ago" use it, so a skewed laptop clock does not lie. */
export function serverNow() { return Date.now() + clockOffset; }

export class ApiError extends Error {
  constructor(status, body, fallback) {
    super(messageOf(body) || fallback || `HTTP ${status}`);
    this.status = status;
    this.body = body;
    this.fields = fieldErrors(body);
  }
}

function messageOf(body) {
  if (!body) return null;
  if (typeof body === 'string') return body;
  const detail = body.detail ?? body.message ?? body.error;
  if (typeof detail === 'string') return detail;
  if (detail && typeof detail === 'object' && !Array.isArray(detail)) {
    return detail.message || detail.detail || null;
  }
  if (Array.isArray(detail)) return 'Some fields are not valid.';
  return null;
}

/**
 * Per-field messages from a 422, whatever its shape:
 *  - FastAPI's {detail: [{loc: ["body", "options", "limit"], msg}]} -> {"options.limit": msg}
 *  - {detail: {errors: {field: msg}}} / {errors: {field: msg}} / {errors: [{field, message}]}
 *  - {detail: {field, message}}
 */
export function fieldErrors(body) {
  const out = {};
  if (!body || typeof body !== 'object') return out;
  const put = (field, msg) => {
    if (!field) return;
    const key = String(field).replace(/^body\./, '');
    out[key] = out[key] ? `${out[key]}; ${msg}` : String(msg);
  };
  const walk = (errs) => {
    if (Array.isArray(errs)) {
      for (const e of errs) {
        if (!e || typeof e !== 'object') continue;
        if (Array.isArray(e.loc)) {
          const loc = e.loc.filter((p) => p !== 'body');
          put(loc.join('.'), e.msg || e.message);
        } else put(e.field || e.name, e.message || e.msg);
      }
    } else if (errs && typeof errs === 'object') {
      for (const [k, v] of Object.entries(errs)) put(k, Array.isArray(v) ? v.join('; ') : (v?.message ?? v));
    }
  };
  const d = body.detail;
  if (Array.isArray(d)) walk(d);
  else if (d && typeof d === 'object') {
    if (d.errors) walk(d.errors);
    else if (d.fields) walk(d.fields);
    else if (d.field) put(d.field, d.message || d.msg);
  }
  if (body.errors) walk(body.errors);
  if (body.fields) walk(body.fields);
  return out;
}

export async function request(method, path, body, { quiet401 = false, timeoutMs = REQUEST_TIMEOUT_MS } = {}) {
  const headers = { Accept: 'application/json' };
  const controller = new AbortController();
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store', signal: controller.signal };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  if (method !== 'GET' && method !== 'HEAD' && csrfToken) headers[CSRF_HEADER] = csrfToken;
  let resp;
  let timedOut = false;
  const timer = setTimeout(() => { timedOut = true; controller.abort(); }, timeoutMs);
  try {
    resp = await fetch(BASE + path, init);
  } catch (err) {
    clearTimeout(timer);
    throw new ApiError(0, null, timedOut
      ? `The API did not answer within ${Math.round(timeoutMs / 1000)} s.`
      : 'The API cannot be reached. Is it running?');
  }
  const date = resp.headers.get('Date');
  if (date) {
    const t = Date.parse(date);
    if (!Number.isNaN(t)) clockOffset = t - Date.now();
  }
  let data = null;
  const type = resp.headers.get('Content-Type') || '';
  if (resp.status !== 204) {
    // The body is under the same deadline: an API that froze mid-answer aborts the read.
    data = type.includes('json') ? await resp.json().catch(() => null) : await resp.text().catch(() => null);
  }
  clearTimeout(timer);
  if (timedOut) throw new ApiError(0, null, `The API did not answer within ${Math.round(timeoutMs / 1000)} s.`);
  if (data && typeof data === 'object' && typeof data.csrf_token === 'string') setCsrf(data.csrf_token);
  if (!resp.ok) {
    const err = new ApiError(resp.status, data, resp.statusText);
    if (resp.status === 401 && !quiet401) unauthorisedHandlers.forEach((fn) => fn(err));
    throw err;
  }
  return data;
}

export const get = (path, opts) => request('GET', path, undefined, opts);
export const post = (path, body, opts) => request('POST', path, body ?? {}, opts);
export const put = (path, body, opts) => request('PUT', path, body ?? {}, opts);
export const del = (path, opts) => request('DELETE', path, undefined, opts);

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== '') q.set(k, v);
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}
