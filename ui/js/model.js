// What the panel reads from the API, normalised in one place so a view never guesses field names.
import { h } from './dom.js';
import { duration, ago, absolute, number } from './format.js';
import { serverNow } from './api.js';

export const ACTIVE = ['QUEUED', 'RUNNING'];
export const STATUSES = ['QUEUED', 'RUNNING', 'SUCCESS', 'FAILED', 'INTERRUPTED', 'CANCELLED'];
export const TRIGGERS = ['PANEL', 'API', 'CLI', 'SCHEDULE'];

/** A run's trigger in words ("panel", "command line"): the API's codes are upper case. */
const TRIGGER_WORDS = { PANEL: 'panel', API: 'API', CLI: 'command line', SCHEDULE: 'schedule' };
export function triggerText(trigger) {
  if (!trigger) return '';
  return TRIGGER_WORDS[String(trigger).toUpperCase()] || String(trigger).toLowerCase();
}

/** The engine a default run uses: the effective one, else the catalogue's default, else its only one. */
export function effectiveEngine(w) {
  return w.engine || w.raw?.default_engine || (w.engines.length === 1 ? w.engines[0].name : null);
}

const pick = (obj, ...keys) => {
  for (const k of keys) {
    if (obj && obj[k] !== undefined && obj[k] !== null) return obj[k];
  }
  return null;
};

export function items(data, ...keys) {
  if (Array.isArray(data)) return data;
  for (const k of [...keys, 'items', 'results', 'data']) {
    if (data && Array.isArray(data[k])) return data[k];
  }
  return [];
}

/** A worker's declared options as a list: [{name, type, default, choices, min, max, description, required}]. */
export function optionSpecs(raw) {
  if (!raw) return [];
  const list = Array.isArray(raw) ? raw : Object.entries(raw).map(([name, spec]) => ({ name, ...(spec && typeof spec === 'object' ? spec : { default: spec }) }));
  return list.map((o) => ({
    name: o.name,
    type: String(o.type || (typeof o.default === 'boolean' ? 'bool' : typeof o.default === 'number' ? (Number.isInteger(o.default) ? 'int' : 'float') : 'str')).toLowerCase(),
    default: o.default ?? null,
    choices: o.choices || o.enum || null,
    min: o.min ?? o.minimum ?? o.ge ?? null,
    max: o.max ?? o.maximum ?? o.le ?? null,
    description: o.description || o.help || '',
    required: Boolean(o.required),
    nullable: o.nullable ?? o.default === null,
  })).filter((o) => o.name && o.name !== 'config');
}

/** Engines as [{name, presets: [names], default_preset, description}]. */
export function engineList(raw) {
  if (!raw) return [];
  const list = Array.isArray(raw) ? raw : Object.entries(raw).map(([name, e]) => ({ name, ...(Array.isArray(e) ? { presets: e } : e) }));
  return list.map((e) => {
    if (typeof e === 'string') return { name: e, presets: [], default_preset: null, description: '' };
    const presets = Array.isArray(e.presets) ? e.presets : e.presets ? Object.keys(e.presets) : [];
    return {
      name: e.name,
      presets: presets.map((p) => (typeof p === 'string' ? p : p.name)),
      default_preset: e.default_preset ?? null,
      description: e.description || e.label || '',
      options: optionSpecs(e.options),
    };
  });
}

export function normaliseWorker(w) {
  let settings = pick(w, 'settings') || {};
  const persisted = settings.persisted ?? null;
  if (settings.effective && typeof settings.effective === 'object') settings = settings.effective;
  const counts = pick(w, 'counts') || {};
  const engines = engineList(pick(w, 'engines', 'available_engines'));
  // Presets: a top-level list of {name, engine?} (engine null: any engine), or per engine.
  const presets = [];
  for (const p of pick(w, 'presets') || []) {
    if (typeof p === 'string') presets.push({ name: p, engine: null });
    else if (p && p.name) presets.push({ name: p.name, engine: p.engine ?? null, description: p.description || '' });
  }
  for (const e of engines) {
    for (const name of e.presets) {
      if (!presets.some((p) => p.name === name && (p.engine === e.name || p.engine === null))) presets.push({ name, engine: e.name });
    }
  }
  const active = pick(w, 'active_run', 'active');
  const last = pick(w, 'last_run', 'last');
  return {
    raw: w,
    name: w.name,
    label: w.label || w.name,
    description: w.description || '',
    unit: w.unit || 'document',
    governed: Boolean(w.governed),
    requires: w.requires || [],
    engine: pick(settings, 'engine_name', 'engine'),
    preset: pick(settings, 'preset'),
    batchSize: pick(settings, 'db_batch_size', 'batch_size') ?? pick(w, 'default_batch_size'),
    settingsSource: pick(settings, 'source', 'sources'),
    // A default run would be refused (a required model directory no layer sets): {field, message}.
    setupError: settings.error && typeof settings.error === 'object' ? settings.error : null,
    persisted,
    engines,
    presets,
    engineSource: w.engine_source || null,
    options: optionSpecs(pick(w, 'option_specs', 'options_spec', 'options', 'signature')),
    acceptsExtra: Boolean(w.accepts_extra_options),
    pending: pick(counts, 'pending') ?? pick(w, 'pending', 'pending_count'),
    processed: pick(counts, 'processed', 'done') ?? pick(w, 'processed', 'processed_count'),
    failed: pick(counts, 'failed', 'error', 'errors') ?? pick(w, 'failed', 'failed_count'),
    active: active ? normaliseRun(active) : null,
    last: last ? normaliseRun(last) : null,
    runners: pick(w, 'capable_runners', 'runners', 'online_runners') || [],
    queuedReason: pick(w, 'queued_reason', 'waiting_reason', 'not_running_reason', 'reason') ?? (active ? pick(active, 'queued_reason', 'waiting_reason') : null),
    // The worker's schedule is quarantined for a crash loop: {schedule_id, reason, fingerprint, run_id}.
    quarantine: w.quarantine && typeof w.quarantine === 'object' ? w.quarantine : null,
  };
}

export function normaliseRun(r) {
  if (!r) return null;
  return { ...r, run_id: r.run_id || r.id };
}

/** idle | queued | running | failed (last time) */
export function workerState(w) {
  if (w.active?.status === 'RUNNING') return 'running';
  if (w.active?.status === 'QUEUED') return 'queued';
  if (w.last && ['FAILED', 'INTERRUPTED'].includes(w.last.status)) return 'failed';
  return 'idle';
}

export const STATE_LABEL = { idle: 'Idle', queued: 'Queued', running: 'Running', failed: 'Failed last time' };

/** The activity a list of runs implies, for the polling rule. */
export function activityOf(statuses) {
  if (statuses.includes('RUNNING')) return 'running';
  if (statuses.includes('QUEUED')) return 'queued';
  return 'idle';
}

export function statusBadge(status) {
  return h('span.badge', { class: status || '' }, status || '—');
}

/**
 * The progress of a run: {done, total, unit, fraction|null, started}. ``unit`` is the worker's ("document"),
 * used until the run reports its own. ``started`` is false until the run's first report: the child is
 * still starting (loading its model), which "0 units" would misstate (issue 28, 4).
 */
export function progressOf(run, unit = 'unit') {
  const p = run?.progress || {};
  const started = p.done !== undefined && p.done !== null || p.processed !== undefined && p.processed !== null;
  const done = Number(p.done ?? p.processed ?? 0);
  const total = p.total === null || p.total === undefined ? null : Number(p.total);
  return { done, total, unit: p.unit || unit, fraction: total ? Math.min(1, done / total) : null, raw: p, started };
}

/** "112 of 200 documents", "1 document", or, before the first report, that the run is starting. */
export function progressLabel(p) {
  if (!p.started) return 'Starting: loading the model and the first batch…';
  const units = (n) => (n === 1 ? p.unit : `${p.unit}s`);
  return p.total ? `${number(p.done)} of ${number(p.total)} ${units(p.total)}` : `${number(p.done)} ${units(p.done)}`;
}

// Samples of (time, done) per run: the ETA follows the rate seen between reports, never the time since
// the start (which holds the model's loading and made the first ETA about twice too long).
const samples = new Map();

export function eta(run) {
  const { done, total } = progressOf(run);
  if (!total || done >= total) return null;
  if (run.progress?.eta_seconds !== undefined && run.progress?.eta_seconds !== null) return run.progress.eta_seconds * 1000;
  // Not the runner's reported ``rate``: it is done / (time since the child's start), the model's loading
  // included, which made the first ETA about twice too long (issue 28, 4). The page's own samples are.
  const id = run.run_id;
  const now = serverNow();
  let list = samples.get(id);
  if (!list) { list = []; samples.set(id, list); }
  if (!list.length || list[list.length - 1].done !== done) list.push({ t: now, done });
  while (list.length > 12) list.shift();
  if (samples.size > 200) samples.delete(samples.keys().next().value);
  if (list.length < 3) return null; // two intervals between reports at least: the first one holds the start
  const a = list[1];
  const b = list[list.length - 1];
  if (!(b.done > a.done && b.t > a.t)) return null;
  return (total - done) / ((b.done - a.done) / (b.t - a.t));
}

export function etaText(run) {
  const ms = eta(run);
  return ms === null ? null : `about ${duration(ms)} left`;
}

/** Why a QUEUED run is not running, as one sentence: the API's `queued_reason` {code, message}. */
export function queuedReasonText(reason) {
  if (!reason) return null;
  if (reason.code === 'backing_off' && reason.not_before) {
    return `Backing off before a retry: it may start ${ago(reason.not_before)} (${absolute(reason.not_before)}).`;
  }
  return reason.message || REASONS[reason.code] || reason.code;
}

/**
 * What a worker that cannot run by default is missing, in words: no raw validation message, no API
 * route, no command-line flag (those are for the log and the CLI; issue 28, 5).
 */
export function setupText(w) {
  const field = w.setupError?.field || '';
  const name = field.split('.').pop() || 'setting';
  if (/(^|\.)model$/.test(field)) return 'No model directory is set, so a run would be refused.';
  return `Its ${name.replaceAll('_', ' ')} setting is missing or not valid, so a run would be refused.`;
}

/** "needs a model" when what is missing is a model directory, else "needs a setting". */
export function setupLabel(error) {
  return /(^|\.)model$/.test(error?.field || '') ? 'needs a model' : 'needs a setting';
}

/** The API's codes (scrinalia/api/views.py, queued_reason), for an answer without a message. */
const REASONS = {
  backing_off: 'Backing off before a retry.',
  no_runner: 'No online runner advertises this worker.',
  draining: 'Every capable runner is draining.',
  schema_behind: "The capable runners' schema is behind the database.",
  runners_busy: 'Every capable runner is busy.',
  waiting_for_device: 'Waiting for a free GPU: every device slot of the capable runners is taken.',
  no_device_fits: 'No device of the capable runners has the GPU memory this worker declares.',
  waiting_for_claim: 'Waiting for a runner to claim it.',
};
