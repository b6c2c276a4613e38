// One worker: its trend over 24 h or 7 d (runs per hour by outcome, p50/p95 durations of the successful
// runs), beside its state and links to its runs and settings. The charts are kept across refreshes (a
// refresh hands them new data), so a live update does not flash the page.
import { h, replace } from '../dom.js';
import * as api from '../api.js';
import { unreachable } from '../forms.js';
import { number, plural } from '../format.js';
import { normaliseWorker, workerState, STATE_LABEL, statusBadge } from '../model.js';
import { runsPerHourChart, durationsChart, windowSwitch } from '../charts.js';

export function mount(main, route, ctx) {
  const name = decodeURIComponent(route.args[0]);
  let windowName = route.params?.window === '7d' ? '7d' : '24h';
  const heading = h('h1', name);
  const sub = h('p');
  const errorBox = h('div');
  const quarantineBox = h('div');
  const perHour = runsPerHourChart();
  const durations = durationsChart();
  const totals = h('p.small.chart-totals', { 'aria-live': 'off' });
  const switcher = windowSwitch(windowName, (w) => {
    windowName = w;
    ctx.poke();
  });
  main.append(
    h('div.page-head',
      h('div', heading, sub),
      h('div.actions',
        h('a', { href: `#/runs?worker=${encodeURIComponent(name)}` }, 'Its runs'),
        h('a', { href: `#/workers/${encodeURIComponent(name)}/settings` }, 'Settings'),
        h('a', { href: '#/workers' }, 'All workers'))),
    errorBox,
    quarantineBox,
    h('section.card.section.charts', { 'aria-labelledby': 'trend-h' },
      h('div.chart-head', h('h2#trend-h', 'Trend'), switcher),
      totals,
      h('div.chart-grid', perHour.el, durations.el)),
  );

  async function refresh() {
    let worker;
    let trend;
    try {
      [worker, trend] = await Promise.all([
        api.get(`/system/workers/${encodeURIComponent(name)}`),
        api.get(`/system/charts/workers/${encodeURIComponent(name)}${api.query({ window: windowName })}`),
      ]);
      replace(errorBox);
    } catch (err) {
      if (err.status === 404) {
        replace(main, h('h1', 'Worker not found'), h('p', `No worker is called ${name}.`), h('a', { href: '#/workers' }, 'All workers'));
        return 'idle';
      }
      // Unreachable: the shell's stale notice says it once; a card would only repeat it (issue 28, 3).
      if (err.status !== 401 && unreachable(err) !== 'true') replace(errorBox, h('div.notice.bad', { role: 'alert', dataset: { transient: 'true' } }, `Could not load the charts: ${err.message}`));
      throw err;
    }
    const w = normaliseWorker(worker);
    const state = workerState(w);
    heading.textContent = w.label;
    replace(sub, h('span.badge', { class: state === 'failed' ? 'failed' : state }, STATE_LABEL[state]), ' ',
      h('span.mono.small', w.name),
      w.active ? h('span', ' · ', statusBadge(w.active.status), ' ', h('a', { href: `#/runs/${w.active.run_id}` }, 'the active run')) : null);
    // The worker's schedule paused by the scheduler for a crash loop (decision 0165).
    const q = w.quarantine;
    quarantineBox.dataset.quarantined = q ? 'true' : 'false';
    replace(quarantineBox, q ? h('div.notice.bad.quarantine', { role: 'note' },
      h('span.badge.quarantined', 'schedule quarantined'), ' ', q.reason || 'crash loop', ' ',
      q.fingerprint ? [h('code.fingerprint', q.fingerprint), ' ', h('a', { href: `#/runs?fingerprint=${encodeURIComponent(q.fingerprint)}` }, 'its runs')] : null,
      ' · ', h('a', { href: `#/schedules?schedule=${q.schedule_id}` }, ctx.canOperate() ? 'Resume it on Schedules' : 'See Schedules'))
      : null);
    perHour.update(trend);
    durations.update(trend);
    const sum = (key) => trend.buckets.reduce((s, b) => s + (b[key] || 0), 0);
    const total = ['success', 'failed', 'interrupted', 'cancelled'].reduce((s, k) => s + sum(k), 0);
    totals.dataset.total = String(total);
    totals.textContent = `${plural(total, 'run')} finished in the last ${windowName === '7d' ? '7 days' : '24 hours'} · `
      + `${number(sum('success'))} succeeded · ${number(sum('failed'))} failed · ${number(sum('interrupted'))} interrupted · ${number(sum('cancelled'))} cancelled`;
    return w.active ? (w.active.status === 'RUNNING' ? 'running' : 'queued') : 'idle';
  }

  function unmount() {
    perHour.destroy();
    durations.destroy();
  }

  return { title: name, refresh, unmount };
}
