// Runners: online and stale ones as cards, with capabilities, version, devices and children, and
// Drain; the stopped ones folded away under one line. ``?runner=ID`` (a run's Runner link) shows that
// runner, unfolding it when it has stopped.
import { h, replace, announce, dl } from '../dom.js';
import * as api from '../api.js';
import { unreachable } from '../forms.js';
import { timeEl, duration, bytes, number, shortId, parseTime } from '../format.js';
import { items, progressOf, progressLabel } from '../model.js';
import { serverNow } from '../api.js';
import { slotsChart } from '../charts.js';

/** A runner's slots chart is re-read at most this often (a heartbeat refreshes the page every 15 s). */
const SLOTS_EVERY_MS = 60000;

export function mount(main, route, ctx) {
  const wanted = route.params?.runner || null;
  let stoppedOpen = false;
  const list = h('div.grid.wide', { role: 'list', 'aria-label': 'Runners' });
  const summary = h('p');
  // The oldest holder of the database's xmin horizon (decision 0371): why the ledger's tables grow.
  const horizon = h('p.small.xmin-horizon', { 'aria-live': 'polite' });
  const errorBox = h('div');
  main.append(h('div.page-head', h('div', h('h1', 'Runners'), summary, horizon)), errorBox, list);
  let lastHorizon = null;
  const confirming = new Set();
  let last = [];
  let foldEl = null;
  let scrolled = false;
  const slotCharts = new Map(); // runner_id -> {chart, at}: kept across renders, moved into each card

  async function refreshSlots(runners) {
    const now = Date.now();
    await Promise.all(runners.map(async (r) => {
      let entry = slotCharts.get(r.runner_id);
      if (!entry) {
        entry = { chart: slotsChart(), at: 0 };
        slotCharts.set(r.runner_id, entry);
      }
      if (now - entry.at < SLOTS_EVERY_MS) return;
      try {
        entry.chart.update(await api.get(`/system/charts/runners/${r.runner_id}`));
        entry.at = now;
      } catch (err) {
        if (err.status === 401) throw err; // the card stands without its chart
      }
    }));
  }

  async function refresh() {
    const data = await api.get('/system/runners');
    last = items(data, 'runners');
    lastHorizon = data && data.xmin_horizon ? data.xmin_horizon : null;
    await refreshSlots(last.filter((r) => r.state !== 'stopped' || r.runner_id === wanted));
    render();
    const busy = last.some((r) => (r.children || []).length > 0 && r.state !== 'stopped');
    return busy ? 'running' : 'idle';
  }

  function render() {
    const by = (s) => last.filter((r) => (r.state || 'online') === s).length;
    summary.textContent = `${by('online')} online · ${by('stale')} stale · ${by('stopped')} stopped recently`;
    horizon.textContent = `Database: ${lastHorizon ? lastHorizon.text : 'no transaction holds the xmin horizon back'}`;
    const live = last.filter((r) => r.state !== 'stopped');
    const stopped = last.filter((r) => r.state === 'stopped');
    if (wanted && stopped.some((r) => r.runner_id === wanted)) stoppedOpen = true;
    const fold = stopped.length ? h('details.stopped-runners', {
      open: stoppedOpen,
      ontoggle: (ev) => { stoppedOpen = ev.target.open; },
    }, h('summary', `${stopped.length} stopped in the last 24 h`), h('div.grid.wide', { role: 'list', 'aria-label': 'Stopped runners' }, stopped.map(card))) : null;
    replace(list, live.length ? live.map(card) : h('p.card.empty', { role: 'listitem' }, last.length ? 'No runner is online.' : 'No runner has registered yet. Start one with `scrinalia-runner daemon`.'));
    if (foldEl) foldEl.remove();
    if (fold) list.after(fold);
    foldEl = fold;
    if (wanted) {
      const target = main.querySelector(`article[data-runner-id="${CSS.escape(wanted)}"]`);
      if (target) {
        target.classList.add('highlight');
        target.setAttribute('aria-current', 'true');
        if (!scrolled) { target.scrollIntoView({ block: 'center' }); scrolled = true; }
      }
    }
  }

  function card(r) {
    const state = r.state || 'online';
    const titleId = `runner-${r.runner_id}`;
    const children = r.children || [];
    const devices = r.devices || [];
    const mismatch = r.schema_mismatch ?? r.schema_behind ?? r.version_mismatch ?? false;
    return h('article.card.runner', { class: `state-${state}`, role: 'listitem', 'aria-labelledby': titleId, dataset: { runner: r.name, runnerId: r.runner_id, state } },
      h('div.worker-head',
        h('div', h('h2', { id: titleId }, r.name), h('div.name', `${r.hostname || ''} · pid ${r.pid ?? '—'} · ${shortId(r.runner_id)}`)),
        h('span.badge', { class: state }, state)),
      r.drain_requested_at && state !== 'stopped'
        ? h('p.notice.warn.small', 'Draining: it claims nothing new and stops when its children are done (requested ', timeEl(r.drain_requested_at), r.drain_requested_by ? ` by ${r.drain_requested_by}` : '', ').')
        : null,
      mismatch ? h('p.notice.bad.small', typeof mismatch === 'string' ? mismatch : 'Its schema revision differs from the database: it refuses work until both are on one release.') : null,
      dl([
        ['Kind', r.kind],
        ['Version', r.package_version],
        ['Schema', r.schema_revision ? h('code', r.schema_revision) : null],
        ['Capabilities', (r.capabilities || []).length ? (r.capabilities || []).map((c) => h('span.chip', c)) : h('span.muted', 'none')],
        ['Concurrency', `${children.length} of ${r.concurrency ?? '?'} slots busy`],
        ['Timings', `heartbeat ${r.heartbeat_seconds ?? '?'} s · lease ${r.lease_seconds ?? '?'} s${r.poll_seconds ? ` · poll ${r.poll_seconds} s` : ''}`],
        ['Started', timeEl(r.started_at)],
        [state === 'stopped' ? 'Stopped' : 'Last heartbeat', timeEl(state === 'stopped' ? r.stopped_at : r.last_heartbeat_at)],
        ['Devices', devices.length ? devices.map((d) => device(d, children)) : h('span.muted', 'no GPU')],
      ]),
      slotCharts.has(r.runner_id) ? h('section.runner-slots', { 'aria-label': `Slots busy on ${r.name} over 24 h` }, slotCharts.get(r.runner_id).chart.el) : null,
      h('section', { 'aria-label': `Children of ${r.name}` },
        h('h3', `Children (${children.length})`),
        children.length ? childrenTable(children) : h('p.muted.small', state === 'stopped' ? 'Stopped.' : 'No run in progress.')),
      ctx.canOperate() && state !== 'stopped' && !r.drain_requested_at ? drainControl(r) : null);
  }

  function device(d, children) {
    const mem = d.memory_total_bytes ?? d.memory_total ?? d.total_memory ?? null;
    const used = d.slots ? children.filter((c) => sameDevice(c.device, d)).length : null;
    return h('div.small.device', { dataset: { device: d.uuid || String(d.index ?? '') } },
      `${d.index ?? ''}${d.index !== undefined && d.index !== null ? ': ' : ''}${d.name || 'GPU'}${mem ? ` · ${bytes(mem)}` : ''}${d.uuid ? ` · ${String(d.uuid).slice(0, 12)}` : ''}`,
      used !== null ? ` · ${used} of ${d.slots} slot${d.slots === 1 ? '' : 's'} busy` : '');
  }

  function sameDevice(a, b) {
    if (!a || !b) return false;
    return a.uuid && b.uuid ? a.uuid === b.uuid : a.index === b.index;
  }

  function deviceText(d) {
    if (!d) return 'no GPU';
    const id = d.index ?? d.uuid ?? '?';
    return d.name ? `${id}: ${d.name}` : `GPU ${id}`;
  }

  function childrenTable(children) {
    return h('div.table-wrap', h('table.stack',
      h('thead', h('tr', ['PID', 'Run', 'Worker', 'Device', 'Progress', 'RSS', 'GPU', 'Elapsed'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', children.map((c) => {
        const p = c.progress || {};
        const prog = p.done !== undefined && p.done !== null ? progressLabel(progressOf(c, p.unit || 'unit')) : 'starting';
        const started = parseTime(c.started_at);
        const elapsed = c.elapsed_seconds ?? c.elapsed_s ?? (started ? (serverNow() - started) / 1000 : null);
        const runId = c.run_id || c.run;
        return h('tr', { dataset: { pid: c.pid } },
          h('td.num', { 'data-label': 'PID' }, c.pid ?? '—'),
          h('td', { 'data-label': 'Run' }, runId ? h('a.mono', { href: `#/runs/${runId}` }, shortId(runId)) : '—'),
          h('td', { 'data-label': 'Worker' }, c.worker || c.worker_name || '—'),
          h('td', { 'data-label': 'Device', class: 'device' }, deviceText(c.device)),
          h('td', { 'data-label': 'Progress' }, prog),
          h('td.num', { 'data-label': 'RSS' }, bytes(c.rss_bytes ?? c.rss)),
          h('td.num', { 'data-label': 'GPU' }, c.gpu_memory_bytes ?? c.gpu_memory ? bytes(c.gpu_memory_bytes ?? c.gpu_memory) : '—'),
          h('td.num', { 'data-label': 'Elapsed' }, elapsed !== null ? duration(elapsed * 1000) : '—'));
      }))));
  }

  function drainControl(r) {
    if (confirming.has(r.runner_id)) {
      return h('div.actions',
        h('span.small', `Drain ${r.name}? It finishes its runs and then stops.`),
        h('button.danger', { type: 'button', onclick: () => drain(r) }, 'Yes, drain it'),
        h('button.secondary', { type: 'button', onclick: () => { confirming.delete(r.runner_id); render(); } }, 'No'));
    }
    return h('div.actions', h('button.secondary', {
      type: 'button', 'aria-label': `Drain ${r.name}`,
      onclick: (ev) => {
        const art = ev.target.closest('article');
        confirming.add(r.runner_id);
        render();
        list.querySelector(`article[data-runner="${CSS.escape(r.name)}"] button.danger`)?.focus();
        return art;
      },
    }, 'Drain'));
  }

  async function drain(r) {
    confirming.delete(r.runner_id);
    try {
      await api.post(`/system/runners/${r.runner_id}/drain`, {});
      announce(`${r.name} is draining.`);
      replace(errorBox);
    } catch (err) {
      replace(errorBox, h('div.notice.bad', { role: 'alert', dataset: { transient: unreachable(err) } }, `Could not drain ${r.name}: ${err.message}`));
    }
    ctx.poke();
  }

  function unmount() {
    for (const { chart } of slotCharts.values()) chart.destroy();
  }

  return { title: 'Runners', refresh, unmount };
}
