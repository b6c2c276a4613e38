// Live updates (decision 0081): one EventSource per tab on /api/v1/system/events. The API relays the
// ledger's notifications; each one makes the current view refresh in place (the poller coalesces a
// burst into one request in flight and one after it). The stream carries no rows, only "this changed",
// so the view re-reads what it shows and stays the one source of what is on the screen.
//
// A stream is live only while frames arrive (decision 0144): the API sends a heartbeat event every
// ``heartbeat_ms`` (its hello says how often), and a stream silent for two of them and a second more is
// down, whatever the socket says: a frozen API keeps its connections open and sends nothing. Down, the
// stream is closed and opened again, and ``onDown`` lets the page say so and check the API at once.
//
// Reconnects: the browser retries by itself after a network error (the server's retry: 2 s); when the
// server refuses the stream (401, 5xx) we retry with a backoff while a session exists. Every (re)open
// says "hello", on which the view does a full refresh: nothing missed meanwhile stays missed.
import { BASE } from './api.js';

const RETRY_MIN_MS = 2000;
const RETRY_MAX_MS = 60000;
const DEFAULT_HEARTBEAT_MS = 15000; // an API whose hello does not say (it sent comments, invisible here)
const WATCH_MS = 500;

function parse(ev, kind) {
  try { return JSON.parse(ev.data); } catch { return { kind }; }
}

/** How long a stream may stay silent before it counts as down: two heartbeats and a second. */
export function silenceLimit(heartbeatMs) {
  return 2 * heartbeatMs + 1000;
}

export function createLive({ onChange, onState, onDown }) {
  let source = null;
  let wanted = false;
  let retryMs = RETRY_MIN_MS;
  let retryTimer = null;
  let connected = false;
  let everConnected = false;
  let heartbeatMs = DEFAULT_HEARTBEAT_MS;
  let lastFrameAt = 0;

  function setConnected(value) {
    if (connected === value) return;
    connected = value;
    if (value) everConnected = true;
    onState(value);
  }

  function down(why) {
    const wasConnected = connected;
    setConnected(false);
    if (onDown) onDown({ why, lastFrameAt: lastFrameAt ? new Date(lastFrameAt) : null, wasConnected });
  }

  function heard() { lastFrameAt = Date.now(); }

  // The watch on a silent stream: a frozen API (or proxy) sends nothing and closes nothing.
  setInterval(() => {
    if (!source || !lastFrameAt) return;
    if (Date.now() - lastFrameAt <= silenceLimit(heartbeatMs)) return;
    source.close();
    source = null;
    down('silent');
    lastFrameAt = Date.now(); // the new stream gets the same time to say hello
    if (wanted) open();
  }, WATCH_MS);

  function open() {
    clearTimeout(retryTimer);
    retryTimer = null;
    if (!wanted || source) return;
    source = new EventSource(`${BASE}/system/events`, { withCredentials: true });
    lastFrameAt = lastFrameAt || Date.now();
    // "Connected" means the stream is open AND the API hears the database: only then may the poll slow.
    source.addEventListener('hello', (ev) => {
      heard();
      retryMs = RETRY_MIN_MS;
      const hello = parse(ev, 'hello');
      heartbeatMs = Number(hello.heartbeat_ms) > 0 ? Number(hello.heartbeat_ms) : DEFAULT_HEARTBEAT_MS;
      setConnected(Boolean(hello.listening));
      onChange({ kind: 'hello' });
    });
    source.addEventListener('heartbeat', (ev) => {
      heard();
      if (parse(ev, 'heartbeat').listening === false) setConnected(false);
    });
    source.addEventListener('offline', () => { heard(); setConnected(false); });
    source.addEventListener('resync', (ev) => { heard(); setConnected(true); onChange(parse(ev, 'resync')); });
    // The session ended (logout, revoked, expired, role changed): the refresh meets the guard.
    source.addEventListener('session-ended', (ev) => { heard(); setConnected(false); onChange(parse(ev, 'session-ended')); });
    for (const kind of ['run', 'runner']) {
      source.addEventListener(kind, (ev) => { heard(); onChange(parse(ev, kind)); });
    }
    source.addEventListener('error', () => {
      down('error');
      if (source && source.readyState === EventSource.CLOSED) {
        // Refused (not a dropped connection): the browser will not retry by itself.
        source = null;
        if (wanted) {
          retryTimer = setTimeout(open, retryMs);
          retryMs = Math.min(RETRY_MAX_MS, retryMs * 2);
        }
      }
    });
  }

  return {
    start() { wanted = true; open(); },
    stop() {
      wanted = false;
      clearTimeout(retryTimer);
      retryTimer = null;
      if (source) { source.close(); source = null; }
      lastFrameAt = 0;
      setConnected(false);
      everConnected = false;
    },
    /** Open the stream again now (the API answered after an outage: no need to wait for the backoff). */
    reopen() {
      if (!wanted) return;
      retryMs = RETRY_MIN_MS;
      if (!source) open();
    },
    get connected() { return connected; },
    /** Wanted and live once, not now: the stream dropped and is being opened again. */
    get dropped() { return wanted && everConnected && !connected; },
  };
}
