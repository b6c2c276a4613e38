// Live updates (decision 0081): one EventSource per tab on /api/v1/system/events. The API relays the
// ledger's notifications; each one makes the current view refresh in place (the poller coalesces a
// burst into one request in flight and one after it). The stream carries no rows, only "this changed",
// so the view re-reads what it shows and stays the one source of what is on the screen.
//
// Reconnects: the browser retries by itself after a network error (the server's retry: 2 s); when the
// server refuses the stream (401, 5xx) we retry with a backoff while a session exists. Every (re)open
// says "hello", on which the view does a full refresh: nothing missed meanwhile stays missed.
import { BASE } from './api.js';

const RETRY_MIN_MS = 2000;
const RETRY_MAX_MS = 60000;

function parse(ev, kind) {
  try { return JSON.parse(ev.data); } catch { return { kind }; }
}

export function createLive({ onChange, onState }) {
  let source = null;
  let wanted = false;
  let retryMs = RETRY_MIN_MS;
  let retryTimer = null;
  let connected = false;

  function setConnected(value) {
    if (connected === value) return;
    connected = value;
    onState(value);
  }

  function open() {
    clearTimeout(retryTimer);
    retryTimer = null;
    if (!wanted || source) return;
    source = new EventSource(`${BASE}/system/events`, { withCredentials: true });
    // "Connected" means the stream is open AND the API hears the database: only then may the poll slow.
    source.addEventListener('hello', (ev) => {
      retryMs = RETRY_MIN_MS;
      setConnected(Boolean(parse(ev, 'hello').listening));
      onChange({ kind: 'hello' });
    });
    source.addEventListener('offline', () => setConnected(false));
    source.addEventListener('resync', (ev) => { setConnected(true); onChange(parse(ev, 'resync')); });
    for (const kind of ['run', 'runner']) {
      source.addEventListener(kind, (ev) => onChange(parse(ev, kind)));
    }
    source.addEventListener('error', () => {
      setConnected(false);
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
      setConnected(false);
    },
    get connected() { return connected; },
  };
}
