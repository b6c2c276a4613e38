// The panel's charts, drawn by uPlot (vendored, pinned: ui/vendor/uplot/, decision 0161). uPlot draws on
// a canvas and sets its few styles through the CSSOM, which the Content-Security-Policy allows; its
// stylesheet is a file (css), so nothing inline is needed.
//
// Each chart is a <figure data-chart="..."> that keeps its uPlot instance (figure.chart.uplot) and the
// series as the API gave them (figure.chart.raw): a refresh calls update() with new data, the canvas is
// kept, so a live run's chart grows in place instead of being rebuilt. The width follows the figure's
// (a ResizeObserver), down to a phone's 390 px.
import uPlot from '../vendor/uplot/uPlot.esm.js';
import { h, replace } from './dom.js';
import { bytes, duration, number, plural } from './format.js';

const HEIGHT = 200;

/** A CSS custom property of the page (the panel's palette follows the colour scheme). */
function colour(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

function palette() {
  return {
    text: colour('--muted', '#4f5b6b'),
    grid: colour('--border', '#cdd4de'),
    ok: colour('--ok', '#1e6b34'),
    danger: colour('--danger', '#a61b1b'),
    warn: colour('--warn', '#7a4d00'),
    grey: colour('--grey', '#474f5a'),
    accent: colour('--accent', '#1d4e89'),
    violet: colour('--violet', '#5b2a86'),
  };
}

function axis(p, extra = {}) {
  return { stroke: p.text, grid: { stroke: p.grid, width: 1 }, ticks: { stroke: p.grid, width: 1 }, ...extra };
}

/**
 * A figure that holds one chart: its title, the canvas (an image whose name is the summary), an
 * empty-state line, the summary as its caption, and its numbers as a table under a disclosure: the text
 * alternative a screen reader (or anyone) reaches (WCAG 1.1.1).
 */
function figure(kind, title) {
  const empty = h('p.muted.small.chart-empty', { hidden: true });
  const plot = h('div.chart-plot', { role: 'img' });
  const caption = h('figcaption.small.chart-summary');
  const tableBox = h('div.table-wrap.chart-table');
  const numbers = h('details.chart-numbers', { hidden: true }, h('summary.small', `${title}: the numbers`), tableBox);
  const el = h('figure.chart', { dataset: { chart: kind } }, h('h3.chart-title', title), plot, empty, caption, numbers);
  return { el, plot, empty, caption, numbers, tableBox };
}

function renderTable(f, table) {
  const rows = table?.rows || [];
  f.numbers.hidden = !rows.length;
  if (!rows.length) { replace(f.tableBox); return; }
  replace(f.tableBox, h('table.chart-data',
    h('caption.visually-hidden', table.caption),
    h('thead', h('tr', table.head.map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', rows.map((r) => h('tr', r.map((c, i) => (i === 0 ? h('th', { scope: 'row' }, c) : h('td', c))))))));
}

/**
 * make(kind, title, build) -> {el, update(raw)}: build(raw, palette) returns {opts, data, summary, isEmpty,
 * table}. The uPlot instance is made on the first update with data and kept; later ones call setData (and
 * remake it only when the series set changes, e.g. a GPU line that appears).
 */
function make(kind, title, build) {
  const f = figure(kind, title);
  const state = { uplot: null, raw: null, key: null };
  f.el.chart = state;
  const width = () => Math.max(240, Math.floor(f.plot.clientWidth || f.el.clientWidth || 320));
  const ro = new ResizeObserver(() => {
    if (state.uplot) state.uplot.setSize({ width: width(), height: HEIGHT });
  });
  ro.observe(f.el);

  function update(raw) {
    state.raw = raw;
    const built = build(raw, palette());
    f.empty.hidden = !built.isEmpty;
    f.empty.textContent = built.isEmpty ? built.emptyText : '';
    f.caption.textContent = built.isEmpty ? '' : built.summary;
    f.caption.hidden = built.isEmpty;
    f.plot.setAttribute('aria-label', `${title}. ${built.summary}`);
    f.plot.hidden = built.isEmpty;
    renderTable(f, built.isEmpty ? null : built.table);
    if (built.isEmpty) return;
    if (state.uplot && state.key === built.key) {
      state.uplot.setData(built.data);
      return;
    }
    if (state.uplot) state.uplot.destroy();
    state.key = built.key;
    state.uplot = new uPlot({ width: width(), height: HEIGHT, ...built.opts }, built.data, f.plot);
  }

  function destroy() {
    ro.disconnect();
    if (state.uplot) state.uplot.destroy();
    state.uplot = null;
  }

  return { el: f.el, update, destroy, state };
}

// --- a worker's runs per hour by outcome (stacked bars) --------------------------------------------

const OUTCOMES = [
  ['success', 'Success', 'ok'],
  ['failed', 'Failed', 'danger'],
  ['interrupted', 'Interrupted', 'warn'],
  ['cancelled', 'Cancelled', 'grey'],
];

/**
 * Stacked bars: series k holds the sum of outcomes 0..k, drawn from the top of the stack down so each
 * shorter bar covers the lower part of the one before; the legend shows each outcome's own count.
 * data[1] (the first series) is therefore the bucket's total.
 */
export function runsPerHourChart() {
  return make('runs-per-hour', 'Runs per hour by outcome', (raw, p) => {
    const buckets = raw?.buckets || [];
    const xs = buckets.map((b) => b.t);
    const own = OUTCOMES.map(([key]) => buckets.map((b) => b[key] || 0));
    const stacked = own.map((_, k) => buckets.map((_b, i) => own.slice(0, k + 1).reduce((s, col) => s + col[i], 0)));
    const order = [...OUTCOMES.keys()].reverse(); // the total first
    const total = stacked[OUTCOMES.length - 1].reduce((s, v) => s + v, 0);
    const bars = uPlot.paths.bars({ size: [0.8, 40], align: 0 });
    const opts = {
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, Math.max(1, max)] } },
      axes: [axis(p), axis(p, { size: 40, values: (_u, ticks) => ticks.map((v) => (Number.isInteger(v) ? number(v) : '')) })],
      series: [{}, ...order.map((k) => {
        const [, label, tone] = OUTCOMES[k];
        return { label, stroke: p[tone], fill: p[tone], width: 0, paths: bars, points: { show: false },
          value: (_u, _v, _si, idx) => (idx === null || idx === undefined ? '—' : number(own[k][idx])) };
      })],
      legend: { live: true },
      cursor: { points: { show: false } },
    };
    return {
      key: 'bars', opts, data: [xs, ...order.map((k) => stacked[k])],
      isEmpty: !buckets.length, emptyText: 'No run in this window.',
      summary: `${plural(total, 'run')} finished in this window: ${OUTCOMES.map(([, label], k) => `${label.toLowerCase()} ${number(own[k].reduce((s, v) => s + v, 0))}`).join(', ')}.`,
      table: {
        caption: 'Runs per hour by outcome',
        head: ['Hour starting', ...OUTCOMES.map(([, label]) => label)],
        rows: buckets.map((b, i) => [b, i]).filter(([, i]) => stacked[OUTCOMES.length - 1][i] > 0)
          .map(([b, i]) => [timeLabel(b.t), ...own.map((col) => number(col[i]))]),
      },
    };
  });
}

// --- a worker's durations (p50 / p95 of the successful runs) ----------------------------------------

export function durationsChart() {
  return make('durations', 'Duration of successful runs (p50, p95)', (raw, p) => {
    const buckets = raw?.buckets || [];
    const step = Number(raw?.step_seconds) || 3600;
    // Each point sits at the middle of its bucket, and the x scale spans the whole window plus half a
    // bucket each side: a fresh install's runs (all in the current hour) show as a point inside the
    // plot, not a dot cut in half by its right edge (issue 28, 1).
    const xs = buckets.map((b) => b.t + step / 2);
    const p50 = buckets.map((b) => b.p50_ms ?? null);
    const p95 = buckets.map((b) => b.p95_ms ?? null);
    const any = p50.some((v) => v !== null);
    const fmt = (_u, v) => (v === null || v === undefined ? '—' : duration(v));
    const lo = buckets.length ? buckets[0].t : 0;
    const hi = buckets.length ? buckets[buckets.length - 1].t + step : 1;
    // Points always drawn (uPlot hides them when a series is dense): one bucket with data is one dot.
    const pts = { show: true, size: 8, width: 2 };
    const opts = {
      scales: {
        x: { time: true, range: () => [lo, hi] },
        // Headroom over the highest value, so the top point sits below the top grid line.
        y: { range: (_u, _min, max) => [0, niceCeil(Math.max(1000, (max || 0) * 1.25))] },
      },
      axes: [axis(p, { space: 70 }), axis(p, { size: 64, values: (_u, ticks) => ticks.map((v) => duration(v)) })],
      series: [{},
        { label: 'p50', stroke: p.accent, width: 2, spanGaps: true, value: fmt, points: { ...pts, fill: p.accent } },
        { label: 'p95', stroke: p.violet, width: 2, dash: [6, 4], spanGaps: true, value: fmt, points: { ...pts, fill: 'transparent' } }],
    };
    const last = [...p50].reverse().find((v) => v !== null);
    const lastP95 = [...p95].reverse().find((v) => v !== null);
    const withData = p50.filter((v) => v !== null).length;
    return {
      key: 'durations', opts, data: [xs, p50, p95],
      isEmpty: !any, emptyText: 'No successful run in this window.',
      summary: any ? `Latest median duration ${duration(last)}${lastP95 !== undefined ? `, 95th percentile ${duration(lastP95)}` : ''}; ${plural(withData, 'hour')} with a successful run.` : 'No successful run in this window.',
      table: {
        caption: 'Duration of successful runs per hour',
        head: ['Hour starting', 'Median (p50)', '95th percentile (p95)'],
        rows: buckets.filter((b) => b.p50_ms !== null && b.p50_ms !== undefined)
          .map((b) => [timeLabel(b.t), duration(b.p50_ms), duration(b.p95_ms)]),
      },
    };
  });
}

/** The next "round" number at or above v (1, 2, 5 times a power of ten): the top of a value axis. */
function niceCeil(v) {
  const mag = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= v) return m * mag;
  return 10 * mag;
}

function timeLabel(t) {
  return new Date(t * 1000).toLocaleString(undefined, { month: 'short', day: '2-digit', hour: '2-digit', minute: '2-digit' });
}

// --- a run's units/s and memory over its life -------------------------------------------------------

/** Time ticks of at least a second (uPlot would put half-seconds early in a run), spaced for their labels. */
const SECOND_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400];

/**
 * ``unit()`` says what the run counts ("document"): the worker's unit, known before the first sample, so
 * the legend says "documents/s" from its first point, as the caption and the progress do (issue 28, 4).
 */
export function runChart(unit = () => 'unit') {
  return make('run', 'Rate and memory over the run', (raw, p) => {
    const points = raw?.points || [];
    const u = raw?.unit || unit();
    const xs = points.map((q) => q.t);
    const rate = points.map((q) => (q.rate === null || q.rate === undefined ? null : q.rate));
    const rss = points.map((q) => q.rss_bytes ?? null);
    const gpu = points.map((q) => q.gpu_bytes ?? null);
    const hasGpu = gpu.some((v) => v !== null);
    const perSecond = `${u}s/s`;
    const rateFmt = (_u, v) => (v === null || v === undefined ? '—' : `${v < 10 ? v.toFixed(2) : Math.round(v)} ${perSecond}`);
    const byteFmt = (_u, v) => (v === null || v === undefined ? '—' : bytes(v));
    const series = [{},
      { label: perSecond, scale: 'rate', stroke: p.accent, width: 2, spanGaps: true, value: rateFmt, points: { size: 4 } },
      { label: 'RSS', scale: 'bytes', stroke: p.ok, width: 2, spanGaps: true, value: byteFmt, points: { size: 4 } }];
    if (hasGpu) series.push({ label: 'GPU memory', scale: 'bytes', stroke: p.violet, width: 2, dash: [6, 4], spanGaps: true, value: byteFmt, points: { size: 4 } });
    const first = xs.length ? xs[0] : 0;
    const lastT = xs.length ? xs[xs.length - 1] : 1;
    const opts = {
      scales: {
        // At least 10 s wide: two samples half a second apart do not make a crowded axis.
        x: { time: true, range: () => [first, Math.max(lastT, first + 10)] },
        rate: { range: (_u, _min, max) => [0, Math.max(1, (max || 0) * 1.1)] },
        bytes: { range: (_u, _min, max) => [0, Math.max(1024 * 1024, (max || 0) * 1.1)] },
      },
      axes: [axis(p, { space: 70, incrs: SECOND_INCRS }),
        axis(p, { scale: 'rate', size: 48, values: (_u, ticks) => ticks.map((v) => (v < 10 ? v.toFixed(1) : Math.round(v))) }),
        axis(p, { scale: 'bytes', side: 1, size: 64, grid: { show: false }, values: (_u, ticks) => ticks.map((v) => bytes(v)) })],
      series,
    };
    const data = [xs, rate, rss];
    if (hasGpu) data.push(gpu);
    const lastRate = [...rate].reverse().find((v) => v !== null);
    const lastRss = [...rss].reverse().find((v) => v !== null);
    const rows = points.slice(-30).map((q) => [
      new Date(q.t * 1000).toLocaleTimeString(),
      q.total ? `${number(q.done ?? 0)} of ${number(q.total)}` : number(q.done ?? 0),
      rateFmt(null, q.rate ?? null), byteFmt(null, q.rss_bytes ?? null), ...(hasGpu ? [byteFmt(null, q.gpu_bytes ?? null)] : [])]);
    return {
      key: hasGpu ? 'run-gpu' : 'run', opts, data,
      isEmpty: !points.length, emptyText: 'No sample yet: the chart starts with the first progress.',
      summary: `${plural(points.length, 'sample')}${lastRate !== undefined ? `, latest ${rateFmt(null, lastRate)}` : ''}${lastRss !== undefined ? `, RSS ${bytes(lastRss)}` : ''}.`,
      table: {
        caption: points.length > 30 ? 'The last 30 samples of the run' : 'The samples of the run',
        head: ['Time', `${u[0].toUpperCase()}${u.slice(1)}s done`, 'Rate', 'RSS', ...(hasGpu ? ['GPU memory'] : [])],
        rows,
      },
    };
  });
}

// --- a runner's busy slots ----------------------------------------------------------------------

export function slotsChart() {
  return make('runner-slots', 'Slots busy', (raw, p) => {
    const buckets = raw?.buckets || [];
    const xs = buckets.map((b) => b.t);
    const busy = buckets.map((b) => b.busy);
    const slots = raw?.concurrency ?? null;
    const series = [{}, {
      label: 'busy', stroke: p.accent, fill: colour('--accent-soft', '#dbe7f5'), width: 2,
      paths: uPlot.paths.stepped({ align: 1 }), points: { show: false },
      value: (_u, v) => (v === null || v === undefined ? '—' : `${v.toFixed(2)}${slots ? ` of ${slots}` : ''}`),
    }];
    const opts = {
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, Math.max(slots || 1, max)] } },
      axes: [axis(p), axis(p, { size: 48 })],
      series,
    };
    const peak = busy.reduce((m, v) => Math.max(m, v), 0);
    const used = buckets.filter((b) => b.busy > 0);
    // A fresh runner has held no slot: a flat line at zero says nothing, a sentence does (issue 28, 1).
    return {
      key: 'slots', opts, data: [xs, busy],
      isEmpty: !used.length,
      emptyText: `No run has held one of its ${slots ?? ''} slots in this window yet.`.replace('its  slots', 'its slots'),
      summary: `At most ${peak.toFixed(2)} of ${slots ?? '?'} slots busy on average per bucket in this window.`,
      table: {
        caption: 'Average slots busy per bucket',
        head: ['Bucket starting', 'Slots busy (average)'],
        rows: used.map((b) => [timeLabel(b.t), `${b.busy.toFixed(2)}${slots ? ` of ${slots}` : ''}`]),
      },
    };
  });
}

/** A 24 h / 7 d switch: two buttons with aria-pressed. */
export function windowSwitch(current, onChange) {
  const buttons = ['24h', '7d'].map((w) => h('button.secondary.small', {
    type: 'button', 'aria-pressed': w === current ? 'true' : 'false', dataset: { window: w },
    onclick: () => {
      for (const b of buttons) b.setAttribute('aria-pressed', b.dataset.window === w ? 'true' : 'false');
      onChange(w);
    },
  }, w === '24h' ? '24 h' : '7 d'));
  return h('div.window-switch', { role: 'group', 'aria-label': 'Window' }, buttons);
}
