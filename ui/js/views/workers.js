// Workers: one card per worker, with its state, the active run's progress and ETA, the last run,
// the counts, the effective engine and preset, the reason a QUEUED run waits, Cancel, and a Run form.
//
// A refresh updates each card's status in place and never rebuilds its form, so a poll does not
// wipe what an operator is typing.
import { h, replace, announce, dl } from '../dom.js';
import * as api from '../api.js';
import { field, showErrors, unreachable } from '../forms.js';
import { optionFields, readOptions } from '../options.js';
import { timeEl, duration, number, shortId, plural } from '../format.js';
import {
  items, normaliseWorker, workerState, STATE_LABEL, statusBadge, progressOf, etaText,
  queuedReasonText, activityOf, setupLabel, setupText, progressLabel, effectiveEngine, triggerText,
} from '../model.js';

const BATCH_MIN = 1;
const BATCH_MAX = 10000;

export function mount(main, _route, ctx) {
  const grid = h('div.grid', { role: 'list', 'aria-label': 'Workers' });
  const summary = h('p', { 'aria-live': 'off' });
  const errorBox = h('div');
  main.append(
    h('div.page-head', h('div', h('h1', 'Workers'), summary)),
    errorBox,
    grid,
  );
  const cards = new Map();
  const confirming = new Set();

  async function refresh() {
    let data;
    try {
      data = await api.get('/system/workers');
      replace(errorBox);
    } catch (err) {
      // Unreachable: the shell's stale notice says it once; a card would only repeat it (issue 28, 3).
      if (err.status !== 401 && unreachable(err) !== 'true') replace(errorBox, h('div.notice.bad', { role: 'alert', dataset: { transient: 'true' } }, `Could not load the workers: ${err.message}`));
      throw err;
    }
    const workers = items(data, 'workers').map(normaliseWorker);
    const seen = new Set();
    for (const w of workers) {
      seen.add(w.name);
      let card = cards.get(w.name);
      if (!card) {
        card = buildCard(w);
        cards.set(w.name, card);
        grid.append(card.el);
      }
      updateCard(card, w);
    }
    for (const [name, card] of cards) {
      if (!seen.has(name)) { card.el.remove(); cards.delete(name); }
    }
    if (!workers.length) replace(grid, h('p.card.empty', { role: 'listitem' }, 'No worker is installed.'));
    const running = workers.filter((w) => w.active?.status === 'RUNNING').length;
    const queued = workers.filter((w) => w.active?.status === 'QUEUED').length;
    summary.textContent = `${plural(workers.length, 'worker')} · ${running} running · ${queued} queued`;
    return activityOf(workers.map((w) => w.active?.status).filter(Boolean));
  }

  function buildCard(w) {
    const titleId = `worker-${w.name}-title`;
    const badge = h('span.badge');
    const status = h('div.worker-status');
    const form = ctx.canOperate() ? buildForm(w) : null;
    const el = h('article.card.worker', { role: 'listitem', 'aria-labelledby': titleId, dataset: { worker: w.name } },
      h('div.worker-head',
        h('div', h('h2', { id: titleId }, h('a', { href: workerHref(w.name) }, w.label)), h('div.name', w.name)),
        h('div.worker-head-side', badge,
          h('a.small', { href: workerHref(w.name), 'aria-label': `Trend of ${w.label}` }, 'Trend'),
          h('a.small', { href: settingsHref(w.name), 'aria-label': `Settings of ${w.label}` }, 'Settings'))),
      w.description ? h('p.desc', w.description) : null,
      status,
      form);
    return { el, badge, status, form, worker: w };
  }

  function updateCard(card, w) {
    card.worker = w;
    const state = workerState(w);
    card.el.classList.remove('state-idle', 'state-queued', 'state-running', 'state-failed');
    card.el.classList.add(`state-${state}`);
    card.el.dataset.state = state;
    card.badge.className = `badge ${state === 'failed' ? 'failed' : state}`;
    card.badge.textContent = STATE_LABEL[state];
    // One slot per worker: while a run holds it, another Run would only get a 409.
    const submit = card.form?.querySelector('button[type="submit"]');
    if (submit) {
      delete submit.dataset.frozen; // this answer decides, not the stale page's freeze (app.js)
      submit.disabled = Boolean(w.active);
      submit.title = w.active ? 'A run is active: wait for it to end, or cancel it' : '';
    }
    card.el.dataset.needs = w.setupError ? setupLabel(w.setupError) : '';
    card.el.dataset.quarantined = w.quarantine ? 'true' : 'false';
    replace(card.status,
      w.quarantine ? quarantineNote(w) : null,
      w.setupError ? h('div.notice.warn.small.needs-setup', { role: 'note' },
        h('strong', `${w.label} ${setupLabel(w.setupError)}. `), setupText(w), ' ',
        h('a', { href: settingsHref(w.name) }, ctx.canOperate() ? 'Open its settings to set it' : 'See its settings')) : null,
      w.active ? activeBlock(w) : null,
      h('div.counts', { 'aria-label': 'Counts' },
        count(w.pending, `pending ${w.unit}s`, 'pending'),
        count(w.processed, 'processed', 'processed'),
        count(w.failed, 'failed', 'failed')),
      dl([
        ['Engine', effectiveEngine(w) ? h('code', effectiveEngine(w)) : 'none'],
        ['Preset', w.preset ? h('code', w.preset) : null],
        ['Database batch', w.batchSize ? `${plural(w.batchSize, w.unit)} per commit` : null],
        ['Last run', lastRun(w.last)],
        ['Runners', runnersText(w)],
      ]));
  }

  // The worker's schedule was paused by the scheduler: its last retry chains failed the same way.
  function quarantineNote(w) {
    const q = w.quarantine;
    return h('div.notice.bad.small.quarantine', { role: 'note' },
      h('span.badge.quarantined', 'schedule quarantined'), ' ',
      q.reason || 'crash loop', ' ',
      q.fingerprint ? [h('code.fingerprint', q.fingerprint), ' ', h('a', { href: `#/runs?fingerprint=${encodeURIComponent(q.fingerprint)}` }, 'its runs')] : null,
      ' · ', h('a', { href: `#/schedules?schedule=${q.schedule_id}` }, ctx.canOperate() ? 'Resume it on Schedules' : 'See Schedules'));
  }

  function count(value, label, key) {
    return h('div.count', { dataset: { count: key } }, h('strong', value === null ? '—' : number(value)), h('span', label));
  }

  function runnersText(w) {
    const list = Array.isArray(w.runners) ? w.runners : [];
    if (!list.length) return h('span.muted', 'no online runner can run it');
    return list.map((r) => h('span.chip', typeof r === 'string' ? r : (r.name || shortId(r.runner_id))));
  }

  function lastRun(run) {
    if (!run) return h('span.muted', 'never run');
    const who = run.requested_by ? ` by ${run.requested_by}` : '';
    return h('span',
      statusBadge(run.status), ' ',
      h('a', { href: `#/runs/${run.run_id}` }, run.duration_ms !== null && run.duration_ms !== undefined ? duration(run.duration_ms) : 'details'),
      ` · ${triggerText(run.trigger)}${who} · `,
      timeEl(run.finished_at || run.queued_at));
  }

  function activeBlock(w) {
    const run = w.active;
    const p = progressOf(run, w.unit);
    const parts = [];
    parts.push(h('div.line',
      h('span', statusBadge(run.status), ' ', h('a', { href: `#/runs/${run.run_id}` }, `run ${shortId(run.run_id)}`),
        h('span.muted', ` · ${triggerText(run.trigger)}${run.requested_by ? ` by ${run.requested_by}` : ''} · `),
        timeEl(run.started_at || run.queued_at)),
      ctx.canOperate() && !run.cancel_requested_at ? cancelControl(run) : null));
    if (run.status === 'RUNNING') {
      const label = progressLabel(p);
      const pct = p.fraction === null ? null : Math.round(p.fraction * 100);
      parts.push(h('div.bar', {
        class: pct === null ? 'indeterminate' : '',
        role: 'progressbar',
        'aria-label': `Progress of ${w.label}`,
        'aria-valuemin': '0',
        'aria-valuemax': p.total ? String(p.total) : false,
        'aria-valuenow': p.total ? String(p.done) : false,
        'aria-valuetext': label,
      }, h('span', { style: { width: `${pct ?? 0}%` } })));
      const eta = etaText(run);
      parts.push(h('div.small.progress-text', label, pct !== null ? ` (${pct}%)` : '', eta ? h('span.eta', ` · ${eta}`) : ''));
    }
    if (run.cancel_requested_at) {
      parts.push(h('div.notice.warn.small', 'Cancellation requested: it stops at the next batch boundary.'));
    }
    if (run.status === 'QUEUED') {
      const reason = queuedReasonText(w.queuedReason || run.queued_reason || run.waiting_reason);
      parts.push(h('div.notice.warn.small.queued-reason', h('strong', 'Why it is not running yet: '),
        reason || 'waiting for a runner to claim it.'));
    }
    return h('div.active', { 'aria-label': 'Active run' }, parts);
  }

  function cancelControl(run) {
    const id = run.run_id;
    if (confirming.has(id)) {
      return h('span.actions',
        h('span.small', 'Cancel this run?'),
        h('button.danger', { type: 'button', onclick: () => doCancel(run) }, 'Yes, cancel it'),
        h('button.secondary', { type: 'button', onclick: () => { confirming.delete(id); ctx.poke(); } }, 'No'));
    }
    return h('button.danger', {
      type: 'button',
      'aria-label': `Cancel run ${shortId(id)}`,
      onclick: (ev) => {
        const cardEl = ev.target.closest('article');
        confirming.add(id);
        rerender();
        cardEl?.querySelector('.active button.danger')?.focus();
      },
    }, 'Cancel');
  }

  function rerender() {
    for (const card of cards.values()) updateCard(card, card.worker);
  }

  async function doCancel(run) {
    confirming.delete(run.run_id);
    try {
      const data = await api.post(`/system/runs/${run.run_id}/cancel`, {});
      const status = data?.status || data?.run?.status;
      announce(status === 'CANCELLED' ? 'The run was cancelled.' : 'Cancellation requested: the run stops at the next batch.');
    } catch (err) {
      announce(`Could not cancel: ${err.message}`);
      replace(errorBox, h('div.notice.bad', { role: 'alert', dataset: { transient: unreachable(err) } }, `Could not cancel the run: ${err.message}`));
    }
    ctx.poke();
  }

  // --- the Run form ---

  function buildForm(w) {
    const formError = h('div.form-error', { role: 'alert' });
    const fields = {};
    const engineSel = h('select');
    engineSel.append(h('option', { value: '' }, `Default${w.engine ? ` (${w.engine})` : ''}`));
    for (const e of w.engines) engineSel.append(h('option', { value: e.name }, e.name));
    const presetSel = h('select');
    const fillPresets = () => {
      const engine = engineSel.value || w.engine;
      const keep = presetSel.value;
      replace(presetSel, h('option', { value: '' }, `Default${w.preset && !engineSel.value ? ` (${w.preset})` : ''}`));
      for (const p of w.presets) {
        if (p.engine === null || p.engine === engine) presetSel.append(h('option', { value: p.name }, p.name));
      }
      if ([...presetSel.options].some((o) => o.value === keep)) presetSel.value = keep;
    };
    fillPresets();
    engineSel.addEventListener('change', fillPresets);
    if (w.engines.length > 0) fields.engine_name = field({ label: 'Engine', name: 'engine_name', control: engineSel });
    if (w.presets.length > 0) fields.preset = field({ label: 'Preset', name: 'preset', control: presetSel });
    fields.db_batch_size = field({
      label: 'Database batch', name: 'db_batch_size',
      hint: `${w.unit}s read and committed together, from ${BATCH_MIN} to ${number(BATCH_MAX)}`,
      control: h('input', { type: 'number', inputmode: 'numeric', min: BATCH_MIN, max: BATCH_MAX, step: 1, placeholder: w.batchSize ?? '' }),
    });
    const workerOptions = optionFields(w.options, 'options');
    for (const o of workerOptions) fields[o.f.name] = o.f;
    // The engine's options follow the engine chosen (or the effective one): rebuilt on a change.
    const engineBox = h('div.form-grid');
    const engineSet = h('fieldset', h('legend', 'Engine options'), engineBox);
    let engineOptions = [];
    const fillEngineOptions = () => {
      for (const o of engineOptions) delete fields[o.f.name];
      const spec = w.engines.find((e) => e.name === (engineSel.value || w.engine || w.raw.default_engine));
      engineOptions = optionFields(spec ? spec.options : [], 'engine_options');
      for (const o of engineOptions) fields[o.f.name] = o.f;
      replace(engineBox, engineOptions.map(({ f }) => f.el));
      engineSet.hidden = !engineOptions.length;
    };
    fillEngineOptions();
    engineSel.addEventListener('change', fillEngineOptions);

    const submit = h('button', { type: 'submit' }, 'Run');

    function collect() {
      const body = {};
      const errors = {};
      if (fields.engine_name?.input.value) body.engine_name = fields.engine_name.input.value;
      if (fields.preset?.input.value) body.preset = fields.preset.input.value;
      const bs = fields.db_batch_size.input.value.trim();
      if (bs !== '') {
        const n = Number(bs);
        if (!Number.isInteger(n) || n < BATCH_MIN || n > BATCH_MAX) errors.db_batch_size = `Enter a whole number from ${BATCH_MIN} to ${BATCH_MAX}.`;
        else body.db_batch_size = n;
      }
      const opts = readOptions(workerOptions, 'options');
      const engineOpts = readOptions(engineOptions, 'engine_options');
      Object.assign(errors, opts.errors, engineOpts.errors);
      const options = opts.values;
      if (Object.keys(engineOpts.values).length) body.engine_options = engineOpts.values;
      if (Object.keys(options).length) body.options = options;
      return { body, errors };
    }

    async function onSubmit(ev) {
      ev.preventDefault();
      const { body, errors } = collect();
      if (Object.keys(errors).length) { showErrors(fields, { fields: errors }, formError); return; }
      showErrors(fields, null, formError);
      submit.disabled = true;
      try {
        const run = await api.post(`/system/workers/${encodeURIComponent(w.name)}/runs`, body);
        const id = run?.run_id || run?.run?.run_id;
        announce(`${w.label}: run ${shortId(id)} queued.`);
        formError.textContent = '';
      } catch (err) {
        if (err.status === 409) {
          const active = err.body?.detail?.active_run || err.body?.active_run || err.body?.detail?.run;
          formError.textContent = `${w.label} already has an active run${active?.run_id ? ` (${shortId(active.run_id)}, ${active.status})` : ''}.`;
        } else {
          showErrors(fields, err, formError, { engine: 'engine_name', batch_size: 'db_batch_size', db_batch_size: 'db_batch_size' });
          if (Object.keys(err.fields || {}).length) advanced.open = true; // show the field that was refused
        }
      } finally {
        submit.disabled = false;
        ctx.poke();
      }
    }

    const advanced = h('details.run-options',
      h('summary', 'Options'),
      h('div.form-grid', ['engine_name', 'preset', 'db_batch_size'].filter((k) => fields[k]).map((k) => fields[k].el)),
      workerOptions.length ? h('fieldset', h('legend', 'Worker options'), h('div.form-grid', workerOptions.map(({ f }) => f.el))) : null,
      engineSet);
    return h('form.run-form', { onsubmit: onSubmit, novalidate: true, 'aria-label': `Run ${w.label}` },
      advanced, formError, h('div.actions', submit, h('span.small.muted', 'Empty fields use the effective settings.')));
  }

  return { title: 'Workers', refresh };
}

function workerHref(name) {
  return `#/workers/${encodeURIComponent(name)}`;
}

function settingsHref(name) {
  return `#/workers/${encodeURIComponent(name)}/settings`;
}
