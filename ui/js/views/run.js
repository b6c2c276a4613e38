// One run: the request beside the effective configuration, the timings, the exit fields, the error,
// the metrics, the result and the chain of attempts.
import { h, replace, announce, dl } from '../dom.js';
import * as api from '../api.js';
import { timeEl, absolute, duration, bytes, number, shortId, json, parseTime } from '../format.js';
import { statusBadge, progressOf, progressLabel, etaText, activityOf, ACTIVE, queuedReasonText, items, triggerText } from '../model.js';
import { runChart } from '../charts.js';

const SIGNALS = { 1: 'SIGHUP', 2: 'SIGINT', 4: 'SIGILL', 6: 'SIGABRT', 7: 'SIGBUS', 8: 'SIGFPE', 9: 'SIGKILL', 11: 'SIGSEGV', 13: 'SIGPIPE', 15: 'SIGTERM' };
const REASONS = {
  exception: 'the worker raised an exception',
  signal: 'the child was killed by a signal',
  oom: 'the child was killed, probably out of memory',
  timeout: 'the run exceeded the runner’s --max-runtime',
  'lease-lost': 'the runner lost the lease',
  'runner-stopped': 'the runner stopped (drain deadline passed)',
  cancelled: 'cancelled at a batch boundary',
  'cancel-forced': 'cancelled by force after the grace period',
  configuration: 'the configuration cannot run here (a setting, a model directory); not retried by the scheduler',
  'cuda-error': 'a CUDA error (device-side assert, illegal memory access, ...) killed the run',
  'cuda-oom': 'CUDA ran out of GPU memory (not the host’s OOM killer)',
  stalled: 'the child sent nothing and used no CPU for its stall timeout: its Python stack is in the error',
};

/** What an operator may retry (the API's RETRYABLE). */
const RETRYABLE = ['FAILED', 'INTERRUPTED'];

/** A live run's chart is re-read at most this often (its progress events come several times a second). */
export const CHART_EVERY_MS = 3000;

export function mount(main, route, ctx) {
  const runId = route.args[0];
  const body = h('div');
  main.append(body);
  let confirming = false;
  let retryError = null;
  const chainCache = new Map();
  let schedules = null; // id -> schedule, read once: a run names its schedule, not a bare number
  // Made once and moved into each render: the canvas survives a refresh, and a live run's chart gains
  // points in place (each ledger event refreshes the view, which re-reads the series).
  let unit = null; // the worker's unit ("document"), read once: the run's own progress may not say it yet
  let chartAt = 0;
  let chartStatus = null;
  const chart = runChart(() => unit || 'unit');
  const chartCard = h('section.card.section', { 'aria-labelledby': 'chart-h' },
    h('h2#chart-h', 'Over its life'),
    h('p.small.muted', 'What it processed per second between samples, and the child’s memory (RSS, GPU) as the supervisor samples it at each heartbeat.'),
    chart.el);

  async function refresh() {
    let data;
    try {
      data = await api.get(`/system/runs/${runId}`);
    } catch (err) {
      if (err.status === 404) {
        replace(body, h('h1', 'Run not found'), h('p', `No run has the id ${runId}.`), h('a', { href: '#/runs' }, 'All runs'));
        return 'idle';
      }
      if (err.status === 409 && Array.isArray(err.body?.run_ids)) {
        // A short id that several runs share: let the person pick.
        replace(body, h('h1', `Several runs match ${runId}`),
          h('ul', err.body.run_ids.map((id) => h('li', h('a.mono', { href: `#/runs/${id}` }, id)))));
        return 'idle';
      }
      throw err;
    }
    const run = data?.run && typeof data.run === 'object' ? { ...data.run, ...data } : data;
    const chain = await attempts(run, data);
    if (unit === null) {
      unit = run.progress?.unit || null;
      if (!unit) {
        try { unit = (await api.get(`/system/workers/${encodeURIComponent(run.worker_name)}`))?.unit || 'unit'; } catch { unit = 'unit'; }
      }
    }
    // The series is re-read at most every CHART_EVERY_MS while the run's status stays the same: a live
    // run's progress events come several times a second, and each one refreshed the page (issue 28, 9).
    const now = Date.now();
    if (run.started_at && (run.status !== chartStatus || now - chartAt >= CHART_EVERY_MS)) {
      try {
        chart.update(await api.get(`/system/charts/runs/${runId}`));
        chartAt = now;
        chartStatus = run.status;
      } catch (err) {
        if (err.status === 401) throw err; // the rest of the page stands without its chart
      }
    }
    if (run.schedule_id !== null && run.schedule_id !== undefined && schedules === null) {
      try {
        schedules = new Map(items(await api.get('/system/schedules'), 'schedules').map((sc) => [sc.id, sc]));
      } catch { schedules = new Map(); }
    }
    if (run.status === 'QUEUED' && !run.queued_reason) {
      // The reason lives with the worker (runners, slot, backoff): ask for that one worker.
      try {
        const w = await api.get(`/system/workers/${encodeURIComponent(run.worker_name)}`);
        if (w?.active_run?.run_id === run.run_id) run.queued_reason = w.queued_reason;
      } catch { /* the detail stands without it */ }
    }
    render(run, chain);
    return activityOf([run.status]);
  }

  async function attempts(run, data) {
    const given = data.attempts || data.chain || run.attempts || null;
    if (Array.isArray(given) && given.length) return given;
    // Walk retry_of upwards (each earlier attempt is one request; they never change once ended).
    const chain = [run];
    let prev = run.retry_of;
    while (prev && chain.length < 10) {
      let r = chainCache.get(prev);
      if (!r) {
        try { r = await api.get(`/system/runs/${prev}`); } catch { break; }
        r = r?.run && typeof r.run === 'object' ? r.run : r;
        chainCache.set(prev, r);
      }
      chain.unshift(r);
      prev = r.retry_of;
    }
    return chain;
  }

  function render(run, chain) {
    const active = ACTIVE.includes(run.status);
    const p = progressOf(run, unit || 'unit');
    const sections = [];

    sections.push(h('div.page-head',
      h('div',
        h('h1', `Run ${shortId(run.run_id)} `, h('span.muted', `· ${run.worker_name}`)),
        h('p', statusBadge(run.status), ' ', h('span.mono.small', run.run_id))),
      h('div.actions',
        active && ctx.canOperate() && !run.cancel_requested_at ? cancelButtons(run) : null,
        RETRYABLE.includes(run.status) && ctx.canOperate()
          ? h('button', { type: 'button', onclick: () => doRetry(run), title: 'A new run with the same request (retry_of this one)' }, 'Retry')
          : null,
        h('a', { href: `#/runs?worker=${encodeURIComponent(run.worker_name)}` }, `All ${run.worker_name} runs`),
        run.error_fingerprint ? h('a', { href: `#/runs?fingerprint=${encodeURIComponent(run.error_fingerprint)}` }, 'Runs with this error') : null)));

    if (retryError) sections.push(h('div.notice.bad', { role: 'alert' }, retryError));
    if (run.status === 'RUNNING') {
      const label = progressLabel(p);
      const pct = p.fraction === null ? null : Math.round(p.fraction * 100);
      const eta = etaText(run);
      sections.push(h('section.card', { 'aria-labelledby': 'prog-h' },
        h('h2#prog-h', 'Progress'),
        h('div.bar', {
          class: pct === null ? 'indeterminate' : '', role: 'progressbar', 'aria-labelledby': 'prog-h',
          'aria-valuemin': '0', 'aria-valuemax': p.total ? String(p.total) : false,
          'aria-valuenow': p.total ? String(p.done) : false, 'aria-valuetext': label,
        }, h('span', { style: { width: `${pct ?? 0}%` } })),
        h('p.small', label, pct !== null ? ` (${pct}%)` : '', eta ? h('span.eta', ` · ${eta}`) : '')));
    }
    if (run.cancel_requested_at && active) {
      sections.push(h('p.notice.warn', `Cancellation requested ${run.cancel_requested_by ? `by ${run.cancel_requested_by} ` : ''}`, timeEl(run.cancel_requested_at), ': it stops at the next batch boundary.'));
    }
    if (run.status === 'QUEUED') {
      const reason = run.queued_reason || run.waiting_reason;
      sections.push(h('p.notice.warn', h('strong', 'Why it is not running yet: '),
        queuedReasonText(reason) || 'waiting for a runner to claim it.'));
    }

    if (run.started_at) sections.push(chartCard);

    const queued = parseTime(run.queued_at);
    const started = parseTime(run.started_at);
    sections.push(h('div.cols-2.section',
      h('section.card', { 'aria-labelledby': 'sum-h' }, h('h2#sum-h', 'Summary'), dl([
        ['Worker', h('a', { href: `#/runs?worker=${encodeURIComponent(run.worker_name)}` }, run.worker_name)],
        ['Status', statusBadge(run.status)],
        ['Trigger', triggerText(run.trigger)],
        ['Requested by', run.requested_by],
        ['Attempt', run.attempt ?? 1],
        ['Retry of', run.retry_of ? h('a.mono', { href: `#/runs/${run.retry_of}` }, shortId(run.retry_of)) : null],
        ['Schedule', scheduleText(run.schedule_id)],
        ['Runner', run.runner_id
          ? h('span', h('a', { href: `#/runners?runner=${encodeURIComponent(run.runner_id)}` }, run.runner?.name || shortId(run.runner_id)),
            run.runner ? h('span.muted', ` · ${run.runner.hostname} · ${run.runner.state}`) : null)
          : null],
      ])),
      h('section.card', { 'aria-labelledby': 'time-h' }, h('h2#time-h', 'Timings'), dl([
        ['Queued', stamp(run.queued_at)],
        ['Not before', run.not_before ? stamp(run.not_before) : null],
        ['Started', stamp(run.started_at)],
        ['Waited', queued && started ? duration(started - queued) : null],
        ['Finished', stamp(run.finished_at)],
        ['Duration', run.duration_ms !== null && run.duration_ms !== undefined ? duration(run.duration_ms) : null],
        active ? ['Heartbeat', stamp(run.heartbeat_at)] : null,
        active ? ['Lease expires', stamp(run.lease_expires_at)] : null,
        ['Cancel requested', run.cancel_requested_at ? h('span', stamp(run.cancel_requested_at), run.cancel_requested_by ? ` by ${run.cancel_requested_by}` : '') : null],
      ]))));

    const hasExit = run.exit_code !== null && run.exit_code !== undefined || run.exit_signal || run.exit_reason || run.error;
    if (hasExit) {
      sections.push(h('section.card.section', { 'aria-labelledby': 'exit-h' }, h('h2#exit-h', 'Exit'),
        dl([
          ['Reason', run.exit_reason ? h('span', h('code', run.exit_reason), h('span.muted', ` — ${REASONS[run.exit_reason] || ''}`)) : null],
          ['Exit code', run.exit_code ?? null],
          ['Signal', run.exit_signal ? `${run.exit_signal} (${SIGNALS[run.exit_signal] || 'signal'})` : null],
          ['Fingerprint', run.error_fingerprint ? h('a.mono', { href: `#/runs?fingerprint=${encodeURIComponent(run.error_fingerprint)}` }, run.error_fingerprint) : null],
        ]),
        run.error ? h('div.section', h('h3', 'Error'), h('pre.error-box', run.error)) : null));
    }

    sections.push(h('section.card.section', { 'aria-labelledby': 'cfg-h' },
      h('h2#cfg-h', 'Configuration'),
      h('p.small.muted', 'The request is the promise made at enqueue; the effective configuration is what the runner resolved at claim (explicit > saved settings > default).'),
      compare(run),
      run.config && Object.keys(run.config).length ? h('details.section', h('summary', 'Engine description (describe_config)'), json(run.config)) : null));

    sections.push(h('div.cols-2.section',
      h('section.card', { 'aria-labelledby': 'met-h' }, h('h2#met-h', 'Metrics'), metrics(run.metrics)),
      h('section.card', { 'aria-labelledby': 'res-h' }, h('h2#res-h', 'Result'), json(run.result))));

    sections.push(h('section.card.section', { 'aria-labelledby': 'chain-h' },
      h('h2#chain-h', 'Attempts'),
      chain.length <= 1 && !run.retry_of
        ? h('p.muted', 'This is the only attempt.')
        : h('ol.chain', chain.map((r) => h('li', { 'aria-current': r.run_id === run.run_id ? 'true' : false },
          h('span', `Attempt ${r.attempt ?? '?'}`), statusBadge(r.status),
          r.run_id === run.run_id ? h('span.mono', shortId(r.run_id)) : h('a.mono', { href: `#/runs/${r.run_id}` }, shortId(r.run_id)),
          h('span.muted.small', absolute(r.queued_at)),
          r.exit_reason ? h('code.small', r.exit_reason) : null)))));

    replace(body, sections);
  }

  function cancelButtons(run) {
    if (confirming) {
      return h('span.actions', h('span', 'Cancel this run?'),
        h('button.danger', { type: 'button', onclick: () => doCancel(run) }, 'Yes, cancel it'),
        h('button.secondary', { type: 'button', onclick: () => { confirming = false; ctx.poke(); } }, 'No'));
    }
    return h('button.danger', { type: 'button', onclick: () => { confirming = true; ctx.poke(); } }, 'Cancel');
  }

  function scheduleText(id) {
    if (id === null || id === undefined) return null;
    const sc = schedules?.get(id);
    const label = sc ? `${sc.worker_name} every ${duration(sc.interval_seconds * 1000)}${sc.enabled ? '' : ' (disabled)'}` : `schedule ${id} (removed)`;
    return h('a', { href: `#/schedules?schedule=${id}` }, label);
  }

  async function doRetry(run) {
    retryError = null;
    try {
      const retry = await api.post(`/system/runs/${run.run_id}/retry`, {});
      announce(`Retry queued as run ${shortId(retry.run_id)}.`);
      ctx.navigate(`runs/${retry.run_id}`);
    } catch (err) {
      const active = err.body?.active_run;
      const fields = Object.entries(err.fields || {}).map(([k, v]) => `${k}: ${v}`).join('; ');
      retryError = `Could not retry: ${fields || err.message}${active ? ` (active run ${shortId(active.run_id)}, ${active.status})` : ''}`;
      announce(retryError);
      ctx.poke();
    }
  }

  async function doCancel(run) {
    confirming = false;
    try {
      const data = await api.post(`/system/runs/${run.run_id}/cancel`, {});
      announce((data?.status || data?.run?.status) === 'CANCELLED' ? 'The run was cancelled.' : 'Cancellation requested.');
    } catch (err) {
      announce(`Could not cancel: ${err.message}`);
    }
    ctx.poke();
  }

  return { title: `Run ${shortId(runId)}`, refresh, unmount: () => chart.destroy() };
}

function stamp(value) {
  if (!value) return null;
  return h('span', h('time', { datetime: value }, absolute(value)), h('span.muted', ' · '), timeEl(value));
}

function show(v) {
  if (v === null || v === undefined || v === '') return h('span.muted', '—');
  if (typeof v === 'object') return Object.keys(v).length ? h('pre.mono.small', JSON.stringify(v, null, 1)) : h('span.muted', '{}');
  return h('code', String(v));
}

function compare(run) {
  const req = run.request || {};
  const eff = {
    engine_name: run.engine_name,
    preset: run.preset,
    db_batch_size: run.options?.db_batch_size ?? run.config?.db_batch_size ?? run.db_batch_size ?? null,
    options: run.options ? Object.fromEntries(Object.entries(run.options).filter(([k]) => k !== 'db_batch_size' && k !== 'engine_options')) : null,
    engine_options: run.options?.engine_options ?? run.config?.engine_options ?? null,
  };
  const started = Boolean(run.started_at);
  const rows = [['engine_name', 'Engine'], ['preset', 'Preset'], ['db_batch_size', 'Database batch'], ['options', 'Options'], ['engine_options', 'Engine options']];
  // A table for assistive technology (rows of cells), a CSS grid on screen: each row is display: contents.
  const cells = [h('div.row', { role: 'row' },
    h('div.head.key-head', { role: 'columnheader' }, h('span.visually-hidden', 'Field')),
    h('div.head', { role: 'columnheader' }, 'Requested'),
    h('div.head', { role: 'columnheader' }, started ? 'Effective' : 'Effective (not claimed yet)'))];
  for (const [key, label] of rows) {
    const a = req[key];
    const b = eff[key];
    const differs = started && JSON.stringify(a ?? null) !== JSON.stringify(b ?? null) && !(a === undefined || a === null);
    cells.push(h('div.row', { role: 'row' }, h('div.key', { role: 'rowheader' }, label), h('div', { role: 'cell' }, show(a)),
      h('div', { role: 'cell', class: differs ? 'diff' : '' }, started ? show(b) : h('span.muted', '—'))));
  }
  return h('div.compare', { role: 'table', 'aria-label': 'Requested and effective configuration' }, cells);
}

function metrics(m) {
  if (!m || !Object.keys(m).length) return h('p.muted', 'No metrics recorded.');
  return dl(Object.entries(m).map(([k, v]) => {
    let text = v;
    if (typeof v === 'number') {
      if (/rss|memory|bytes/i.test(k) && v > 4096) text = bytes(v);
      else if (/_ms$/.test(k)) text = duration(v);
      else if (/seconds|_s$/.test(k) && !/per_s|units_s/.test(k)) text = `${v.toFixed ? v.toFixed(2) : v} s`;
      else text = Number.isInteger(v) ? number(v) : v.toFixed(2);
    } else if (typeof v === 'object' && v !== null) text = h('code', JSON.stringify(v));
    return [k.replaceAll('_', ' '), text];
  }));
}
