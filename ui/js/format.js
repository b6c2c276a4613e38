// Formatting: times, durations, sizes, ETA. Times are shown relative, with the absolute time in a
// title (and for screen readers, inside a <time> element's datetime).
import { h } from './dom.js';
import { serverNow } from './api.js';

export function parseTime(value) {
  if (!value) return null;
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  const rs = Math.round(s % 60);
  if (m < 60) return rs ? `${m} min ${rs} s` : `${m} min`;
  const hr = Math.floor(m / 60);
  const rm = m % 60;
  if (hr < 48) return rm ? `${hr} h ${rm} min` : `${hr} h`;
  return `${Math.floor(hr / 24)} d ${hr % 24} h`;
}

export function ago(value) {
  const t = parseTime(value);
  if (t === null) return '—';
  const diff = serverNow() - t;
  if (diff < -5000) return `in ${duration(-diff)}`;
  if (diff < 5000) return 'just now';
  return `${duration(diff)} ago`;
}

export function absolute(value) {
  const t = parseTime(value);
  if (t === null) return '';
  return new Date(t).toLocaleString(undefined, {
    year: 'numeric', month: 'short', day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit',
  });
}

/** <time> showing "3 min ago", with the absolute time as its title. */
export function timeEl(value, mode = 'ago') {
  if (!value) return h('span.muted', '—');
  const text = mode === 'abs' ? absolute(value) : ago(value);
  // data-ago: the shell re-renders it every second, so "38 s ago" does not stand still.
  return h('time', { datetime: value, title: absolute(value), 'data-ago': mode === 'abs' ? false : '' }, text);
}

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return '—';
  n = Number(n);
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n < 10 && i ? n.toFixed(1) : Math.round(n)} ${units[i]}`;
}

export function number(n) {
  if (n === null || n === undefined) return '—';
  return Number(n).toLocaleString();
}

/**
 * The id people see (decision 0143): the last 12 hex digits, the random tail of the UUIDv7. Its first
 * digits are a clock and stay the same for about a minute. The same rule as scrinalia's run_ids.short_id.
 */
export const SHORT_ID_DIGITS = 12;
export function shortId(id) {
  return id ? String(id).replace(/-/g, '').slice(-SHORT_ID_DIGITS) : '—';
}

export function json(value) {
  if (value === null || value === undefined) return h('span.muted', '—');
  if (typeof value === 'object' && Object.keys(value).length === 0) return h('span.muted', '{}');
  return h('pre.json', JSON.stringify(value, null, 2));
}

export function plural(n, one, many = `${one}s`) {
  return `${number(n)} ${n === 1 ? one : many}`;
}
