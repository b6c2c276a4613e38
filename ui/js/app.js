// The panel's shell: the session, the header, the hash router, live updates and the polling rule.
//
// Live updates (decision 0081): the API's event stream makes the current view refresh in place as the
// ledger changes. Polling stays as the fallback: without the stream every 5 s while a run is RUNNING,
// every 15 s while runs are only QUEUED, every 60 s when idle; with the stream a slow safety net
// (30 s, 60 s idle). It resumes at once when the window gets the focus back, when the page becomes
// visible again, and after any action (a run, a cancel, a drain, a filter). Relative times ("38 s
// ago") tick every second.
import { h, replace, announce } from './dom.js';
import * as api from './api.js';
import { AUTH } from './auth.js';
import * as loginView from './views/login.js';
import * as passwordView from './views/password.js';
import * as workersView from './views/workers.js';
import * as workerView from './views/worker.js';
import * as runsView from './views/runs.js';
import * as runView from './views/run.js';
import * as failuresView from './views/failures.js';
import * as runnersView from './views/runners.js';
import { createLive } from './live.js';
import { ago } from './format.js';
import * as schedulesView from './views/schedules.js';
import * as settingsView from './views/settings.js';

export const INTERVALS = { running: 5000, queued: 15000, idle: 60000 };
export const LIVE_INTERVALS = { running: 30000, queued: 30000, idle: 60000 };
// While the page is stale (the API does not answer, or its stream went silent): try again this often,
// so the page recovers by itself within seconds of the API's return (decision 0144).
export const STALE_RETRY_MS = 3000;
const TICK_MS = 1000;

const session = { user: null };
const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
const bar = document.getElementById('refresh-bar');
const barState = document.getElementById('refresh-state');
const staleBar = document.getElementById('stale-bar');
const refreshButton = document.getElementById('refresh-now');

// --- polling ---------------------------------------------------------------------------------------

const poller = {
  view: null,
  timer: null,
  activity: 'idle',
  inflight: null,
  lastAt: null,

  attach(view) {
    this.view = view;
    this.activity = 'idle';
    this.kick();
  },

  detach() {
    clearTimeout(this.timer);
    this.timer = null;
    this.view = null;
  },

  /** The stream went silent or broke: what is on screen may be old from ``since`` on, until an answer. */
  suspect(since, why) {
    if (!this.view || !this.view.refresh) return;
    this.staleSince ??= since || this.lastAt || new Date();
    this.error ??= why;
    this.render();
    this.kick();
  },

  /** Refresh now (focus, action, first paint), then schedule by what the refresh saw. */
  async kick({ manual = false } = {}) {
    clearTimeout(this.timer);
    this.timer = null;
    const view = this.view;
    if (manual) this.manual = true;
    if (!view || !view.refresh) { this.render(); return; }
    if (this.inflight) { this.again = true; this.render(); return; }
    this.inflight = (async () => {
      try {
        const activity = await view.refresh();
        if (view === this.view) this.activity = activity || 'idle';
        this.lastAt = new Date();
        this.error = null;
        this.checking = false;
        clearTransient(main); // errors caused by an unreachable API go when it answers again
        if (this.staleSince) live.reopen(); // back: the stream need not wait for its backoff
        this.staleSince = null;
      } catch (err) {
        this.checking = false;
        if (err instanceof api.ApiError && err.status === 401) return;
        this.error = err.message;
        // The API does not answer (network, 5xx): what is on screen is as of the last answer. Keep
        // polling at the last pace, and say so until an answer comes back.
        if (!(err instanceof api.ApiError) || err.status === 0 || err.status >= 500) this.staleSince ??= this.lastAt || new Date();
      }
    })();
    this.render();
    await this.inflight;
    this.inflight = null;
    this.manual = false;
    if (this.again) { this.again = false; return this.kick(); }
    this.schedule();
  },

  intervals() {
    return live.connected ? LIVE_INTERVALS : INTERVALS;
  },

  schedule() {
    clearTimeout(this.timer);
    this.timer = null;
    // Stale, or the live stream dropped (it is reopened meanwhile): check the API every few seconds.
    const interval = this.staleSince || live.dropped ? STALE_RETRY_MS : this.intervals()[this.activity] ?? null;
    if (this.view && interval && !document.hidden) {
      this.timer = setTimeout(() => this.kick(), interval);
    }
    this.render();
  },

  render() {
    const stale = Boolean(this.staleSince && this.view);
    const trying = Boolean(this.inflight && (this.manual || stale));
    document.body.dataset.stale = stale ? 'true' : 'false';
    freeze(stale);
    staleBar.hidden = !stale;
    if (stale) {
      // The fact once, in one sentence: since when, why, and what that means for what is shown.
      replace(staleBar, h('strong', `Stale since ${this.staleSince.toLocaleTimeString()}: `),
        `${causeOf(this.error)}, so what is shown is as it was then.`,
        trying ? h('span.muted', ' Trying again…') : h('span.muted', ` Trying again every ${STALE_RETRY_MS / 1000} s.`));
    }
    const interval = this.intervals()[this.activity] ?? null;
    document.body.dataset.poll = this.view && interval ? this.activity : 'idle';
    document.body.dataset.pollInterval = this.view && interval ? String(interval / 1000) : '0';
    const isLive = live.connected && !stale;
    document.body.dataset.live = isLive ? 'on' : 'off';
    bar.hidden = !this.view || !this.view.refresh;
    refreshButton.setAttribute('aria-busy', trying ? 'true' : 'false');
    refreshButton.textContent = trying ? 'Refreshing…' : 'Refresh now';
    // The dot's colour repeats the words beside it (green: live), it never says anything alone.
    const dot = h('span.dot', { class: stale ? 'stale' : isLive ? 'live' : this.activity, 'aria-hidden': 'true' });
    let text;
    if (trying) text = stale ? 'Trying to reach the API…' : 'Refreshing…';
    else if (stale) text = 'Not live: see the notice above';
    else if (this.checking || live.dropped) text = `The live stream dropped: checking the API every ${STALE_RETRY_MS / 1000} s until it is back`;
    else if (this.error) text = `Could not refresh: ${this.error}`;
    else if (document.hidden) text = 'Paused while this tab is hidden';
    else if (live.connected) text = 'Live: changes appear as they happen';
    else if (this.activity === 'running') text = 'A run is active: refreshing every 5 s';
    else if (this.activity === 'queued') text = 'Runs are queued: refreshing every 15 s';
    else text = 'Nothing is active: refreshing every 60 s (and on focus or on an action)';
    const at = this.lastAt ? ` · updated ${this.lastAt.toLocaleTimeString()}` : '';
    replace(barState, dot, text, h('span.muted', at));
  },
};

/** The stale notice's cause in words, from the last error (lower case: it follows "Stale since …:"). */
function causeOf(error) {
  if (!error || /cannot be reached/.test(error)) return 'the API cannot be reached';
  if (/did not answer within/.test(error)) return error.replace(/^The API/, 'the API').replace(/\.$/, '');
  if (/live stream has been silent/.test(error)) return 'the API’s live stream has been silent';
  return `the API answered with an error (${error.replace(/\.$/, '')})`;
}

/**
 * While stale, the page's actions are disabled (their answer could not come) and its state badges say
 * they are the last known ones; given back as they were when the API answers again (issue 28, 3).
 */
function freeze(stale) {
  if (stale) {
    for (const b of main.querySelectorAll('button:not([disabled]), input[type="submit"]:not([disabled])')) {
      b.disabled = true;
      b.dataset.frozen = 'true';
    }
    for (const b of main.querySelectorAll('.worker .badge, .page-head .badge')) b.dataset.stale = 'true';
  } else {
    for (const b of main.querySelectorAll('[data-frozen="true"]')) {
      b.disabled = false;
      delete b.dataset.frozen;
    }
    for (const b of main.querySelectorAll('.badge[data-stale]')) delete b.dataset.stale;
  }
}

/** Remove the notices that said the API could not be reached: their cause is gone. */
function clearTransient(root) {
  for (const el of root.querySelectorAll('[data-transient="true"]')) {
    if (el.matches('.form-error')) { el.textContent = ''; delete el.dataset.transient; } else el.remove();
  }
}

// --- live updates ----------------------------------------------------------------------------------

const live = createLive({
  onChange() {
    if (document.hidden) return; // becoming visible refreshes anyway
    poller.kick();
  },
  onState() { poller.schedule(); },
  // Silent past its heartbeats (a frozen API) or broken: not live; say so at once and check the API.
  onDown({ why, lastFrameAt, wasConnected }) {
    if (document.hidden) return;
    if (why === 'silent') poller.suspect(lastFrameAt, 'its live stream has been silent');
    else {
      // Until the check answers, the bar must not claim a calm "refreshing every 60 s" (issue 28, 3).
      if (wasConnected) poller.checking = true;
      poller.kick();
    }
  },
});

function followSession() {
  const user = session.user;
  if (user && !user.mustChangePassword) live.start();
  else live.stop();
}

// Relative times tick: every <time data-ago> is re-rendered each second from its datetime.
setInterval(() => {
  if (document.hidden) return;
  for (const el of main.querySelectorAll('time[data-ago]')) {
    const text = ago(el.getAttribute('datetime'));
    if (el.textContent !== text) el.textContent = text;
  }
}, TICK_MS);

window.addEventListener('focus', () => poller.kick());
document.addEventListener('visibilitychange', () => {
  if (document.hidden) poller.schedule();
  else poller.kick();
});
refreshButton.addEventListener('click', () => poller.kick({ manual: true }));

// --- session ---------------------------------------------------------------------------------------

export function canOperate() {
  return session.user?.role === 'ADMIN';
}

function normaliseUser(data) {
  if (!data) return null;
  const u = data.user && typeof data.user === 'object' ? data.user : data;
  return {
    id: u.id ?? null,
    email: u.email ?? '',
    role: String(u.role || 'VIEWER').toUpperCase(),
    mustChangePassword: Boolean(u.must_change_password ?? data.must_change_password),
  };
}

export function setUser(data) {
  session.user = normaliseUser(data);
  rememberSession(Boolean(session.user));
  renderHeader();
  followSession();
}

// Whether this browser holds a session, as far as the panel knows: set at a login or an answered
// /auth/me, cleared at a logout or a 401. Without it the first load goes to the login page without
// asking /auth/me, whose 401 chromium would print in red in every new visitor's console (issue 28, 9).
const SIGNED_IN = 'scrinalia.signed-in';

export function rememberSession(on) {
  if (on) localStorage.setItem(SIGNED_IN, '1');
  else localStorage.removeItem(SIGNED_IN);
}

async function loadSession() {
  if (!localStorage.getItem(SIGNED_IN)) {
    session.user = null;
    renderHeader();
    return;
  }
  try {
    setUser(await api.get(AUTH.me, { quiet401: true }));
  } catch (err) {
    if (!(err instanceof api.ApiError) || err.status !== 401) throw err;
    rememberSession(false);
    session.user = null;
    renderHeader();
  }
}

async function logout() {
  try { await api.post(AUTH.logout, {}, { quiet401: true }); } catch { /* the session may be gone already */ }
  api.setCsrf(null);
  rememberSession(false);
  session.user = null;
  renderHeader();
  followSession();
  announce('Logged out');
  location.hash = '#/login';
}

function renderHeader() {
  const user = session.user;
  const full = Boolean(user) && !user.mustChangePassword;
  nav.hidden = !full;
  who.hidden = !user;
  if (user) {
    replace(who,
      h('span', h('span.visually-hidden', 'Signed in as '), h('span.email', user.email)),
      h('span.badge', { title: 'Your role' }, user.role),
      h('button.secondary', { type: 'button', onclick: logout }, 'Log out'));
  } else {
    replace(who);
  }
}

api.onUnauthorised(() => {
  if (session.user) announce('Your session has ended; please log in again.');
  rememberSession(false);
  session.user = null;
  renderHeader();
  followSession();
  if (!location.hash.startsWith('#/login')) {
    sessionStorage.setItem('scrinalia.after-login', location.hash);
    location.hash = '#/login';
  }
});

// --- routing ---------------------------------------------------------------------------------------

const ROUTES = [
  { re: /^login$/, view: loginView, anonymous: true },
  { re: /^password$/, view: passwordView, passwordChange: true },
  { re: /^workers$/, view: workersView, nav: 'workers' },
  { re: /^runs$/, view: runsView, nav: 'runs' },
  { re: /^runs\/([0-9a-fA-F-]{8,})$/, view: runView, nav: 'runs' },
  { re: /^failures$/, view: failuresView, nav: 'failures' },
  { re: /^runners$/, view: runnersView, nav: 'runners' },
  { re: /^schedules$/, view: schedulesView, nav: 'schedules' },
  { re: /^workers\/([^/]+)\/settings$/, view: settingsView, nav: 'workers' },
  { re: /^workers\/([^/]+)$/, view: workerView, nav: 'workers' },
];

let current = null;
let routed = false; // false until the first page is shown: the first one is not a navigation

export function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, qs] = raw.split('?');
  return { path: path || 'workers', params: Object.fromEntries(new URLSearchParams(qs || '')) };
}

export function navigate(path, params) {
  const q = api.query(params);
  const target = `#/${path}${q}`;
  if (location.hash === target) route();
  else location.hash = target;
}

const ctx = {
  canOperate,
  navigate,
  poke: () => poller.kick(),
  get user() { return session.user; },
  setUser,
  afterLogin() {
    const back = sessionStorage.getItem('scrinalia.after-login');
    sessionStorage.removeItem('scrinalia.after-login');
    if (session.user?.mustChangePassword) location.hash = '#/password';
    else location.hash = back && !back.startsWith('#/login') && !back.startsWith('#/password') ? back : '#/workers';
  },
};

async function route() {
  const { path, params } = parseHash();
  let match = null;
  let args = [];
  for (const r of ROUTES) {
    const m = r.re.exec(path);
    if (m) { match = r; args = m.slice(1); break; }
  }
  if (!match) { location.replace('#/workers'); return; }

  const user = session.user;
  if (!user && !match.anonymous) {
    sessionStorage.setItem('scrinalia.after-login', location.hash);
    location.replace('#/login');
    return;
  }
  if (user && match.anonymous) { location.replace(user.mustChangePassword ? '#/password' : '#/workers'); return; }
  if (user && user.mustChangePassword && !match.passwordChange) { location.replace('#/password'); return; }
  if (user && !user.mustChangePassword && match.passwordChange && !params.voluntary) {
    location.replace('#/workers');
    return;
  }

  if (current?.unmount) current.unmount();
  poller.detach();
  for (const a of nav.querySelectorAll('a')) {
    if (a.dataset.route === match.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  replace(main);
  current = match.view.mount(main, { args, params }, ctx) || {};
  document.title = `${current.title || 'Scrinalia'} · Scrinalia`;
  // After an in-app navigation, move focus to the page's heading for keyboard and screen-reader users,
  // as a page load would; on a page opened directly the browser's own start (the document) stays, so
  // no focus box appears on a heading the user never moved to (issue 28, 9).
  const heading = main.querySelector('h1');
  if (heading && routed) { heading.tabIndex = -1; heading.focus({ preventScroll: true }); }
  routed = true;
  poller.attach(current);
}

window.addEventListener('hashchange', route);

async function boot() {
  try {
    await loadSession();
  } catch (err) {
    replace(main, h('div.card.notice.bad', { role: 'alert' }, `The API cannot be reached: ${err.message}`));
    return;
  }
  await route();
}

boot();
