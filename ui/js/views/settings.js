// A worker's Settings: what a run with an empty request uses now (and why it cannot run, when it
// cannot), the saved settings (engine, preset, batch size, options, engine options) in a form the API
// validates, and the revisions: who changed what, and when.
//
// The form is built once: a refresh (focus, the poll) updates the effective settings and the
// revisions beside it, never what an operator is typing.
import { h, replace, announce, dl } from '../dom.js';
import * as api from '../api.js';
import { field, showErrors } from '../forms.js';
import { optionFields, readOptions } from '../options.js';
import { timeEl, absolute } from '../format.js';
import { normaliseWorker, setupLabel } from '../model.js';

const BATCH_MIN = 1;
const BATCH_MAX = 10000;

export function mount(main, route, ctx) {
  const name = decodeURIComponent(route.args[0]);
  const heading = h('h1', `Settings · ${name}`);
  const effectiveBox = h('div');
  const formBox = h('div');
  const revisionsBox = h('div');
  const errorBox = h('div');
  // What is saved but may not run: a model directory no online runner of the worker has seen (0145).
  const warningsBox = h('div', { 'data-settings-warnings': '' });
  function renderWarnings(warnings) {
    replace(warningsBox, (warnings || []).map((w) => h('div.notice.warn', { role: 'alert', 'data-field': w.field },
      h('strong', `${w.field}: `), w.message)));
  }
  main.append(
    h('div.page-head', h('div', heading, h('p', h('a', { href: '#/workers' }, 'All workers'), ' · ',
      h('a', { href: `#/runs?worker=${encodeURIComponent(name)}` }, `${name} runs`)))),
    errorBox,
    warningsBox,
    h('div.cols-2.section',
      h('section.card', { 'aria-labelledby': 'eff-h' }, h('h2#eff-h', 'Effective now'),
        h('p.small.muted', 'What a run with an empty request uses: the saved settings over the defaults.'), effectiveBox),
      h('section.card', { 'aria-labelledby': 'saved-h' }, h('h2#saved-h', 'Saved settings'), formBox)),
    h('section.card.section', { 'aria-labelledby': 'rev-h' }, h('h2#rev-h', 'Revisions'), revisionsBox),
  );
  let worker = null;
  let revision = 0; // the saved revision the form was built from: a PUT expects it

  async function refresh() {
    let data;
    try {
      data = await api.get(`/system/workers/${encodeURIComponent(name)}`);
    } catch (err) {
      if (err.status === 404) {
        replace(main, h('h1', 'No such worker'), h('p', `No worker is named ${name}.`), h('a', { href: '#/workers' }, 'All workers'));
        return 'idle';
      }
      throw err;
    }
    worker = normaliseWorker(data);
    heading.textContent = `Settings · ${worker.label}`;
    renderEffective(data.settings?.effective || {});
    if (!formBox.firstChild) buildSaved(data.settings?.persisted || null);
    try {
      renderWarnings((await api.get(`/system/workers/${encodeURIComponent(name)}/settings`)).warnings);
    } catch { /* the page stands without them */ }
    await renderRevisions();
    return 'idle';
  }

  function renderEffective(eff) {
    if (eff.error) {
      replace(effectiveBox, h('div.notice.warn.needs-setup', { role: 'note' },
        h('strong', `${worker.label} ${setupLabel(eff.error)}: `), eff.error.message || eff.error.field,
        ctx.canOperate() ? ' Set it below.' : ' An ADMIN sets it here.'));
      return;
    }
    const src = eff.sources || {};
    const withSource = (value, key) => (value === null || value === undefined || value === ''
      ? null : h('span', h('code', typeof value === 'object' ? JSON.stringify(value) : String(value)),
        src[key] ? h('span.muted.small', ` · ${src[key]}`) : null));
    const pairs = [
      ['Engine', withSource(eff.engine_name, 'engine_name')],
      ['Preset', withSource(eff.preset, 'preset')],
      ['Database batch', withSource(eff.db_batch_size, 'db_batch_size')],
    ];
    for (const [k, v] of Object.entries(eff.options || {})) pairs.push([`options.${k}`, withSource(v, `options.${k}`)]);
    for (const [k, v] of Object.entries(eff.engine_options || {})) pairs.push([`engine_options.${k}`, withSource(v, `engine_options.${k}`)]);
    replace(effectiveBox, dl(pairs));
  }

  function buildSaved(persisted) {
    revision = persisted?.revision ?? 0;
    if (!ctx.canOperate()) {
      replace(formBox, persisted ? dl([
        ['Engine', persisted.engine_name], ['Preset', persisted.preset], ['Database batch', persisted.db_batch_size],
        ['Options', Object.keys(persisted.options || {}).length ? h('code', JSON.stringify(persisted.options)) : null],
        ['Engine options', Object.keys(persisted.engine_options || {}).length ? h('code', JSON.stringify(persisted.engine_options)) : null],
        ['Revision', `${persisted.revision} · ${persisted.updated_by || '—'} · ${absolute(persisted.updated_at)}`],
      ]) : h('p.muted', 'Nothing saved: the worker runs on its defaults.'),
      h('p.small.muted', 'Only an ADMIN changes settings.'));
      return;
    }
    replace(formBox, settingsForm(persisted || {}));
  }

  function settingsForm(saved) {
    const fields = {};
    const formError = h('div.form-error', { role: 'alert' });
    const engineSel = h('select', h('option', { value: '' }, `Default${worker.raw.default_engine ? ` (${worker.raw.default_engine})` : ''}`),
      worker.engines.map((e) => h('option', { value: e.name, selected: saved.engine_name === e.name }, e.name)));
    const presetSel = h('select');
    const engineName = () => engineSel.value || worker.raw.default_engine || null;
    const fillPresets = () => {
      const keep = presetSel.value || saved.preset || '';
      replace(presetSel, h('option', { value: '' }, 'Default'));
      for (const p of worker.presets) {
        if (p.engine === null || p.engine === engineName()) presetSel.append(h('option', { value: p.name }, p.name));
      }
      if ([...presetSel.options].some((o) => o.value === keep)) presetSel.value = keep;
    };
    fillPresets();
    const engineBox = h('div.form-grid');
    const engineSet = h('fieldset', h('legend', 'Engine options'), engineBox);
    let engineOptions = [];
    const fillEngineOptions = () => {
      for (const o of engineOptions) delete fields[o.f.name];
      const spec = worker.engines.find((e) => e.name === engineName());
      const initial = (saved.engine_name || worker.raw.default_engine) === engineName() ? saved.engine_options || {} : {};
      engineOptions = optionFields(spec ? spec.options : [], 'engine_options', initial);
      for (const o of engineOptions) fields[o.f.name] = o.f;
      replace(engineBox, engineOptions.map(({ f }) => f.el));
      engineSet.hidden = !engineOptions.length;
    };
    fillEngineOptions();
    engineSel.addEventListener('change', () => { fillPresets(); fillEngineOptions(); });
    const settable = worker.engineSource === 'settings';
    if (settable && worker.engines.length) fields.engine_name = field({ label: 'Engine', name: 'engine_name', control: engineSel });
    if (settable && worker.presets.length) fields.preset = field({ label: 'Preset', name: 'preset', control: presetSel });
    fields.db_batch_size = field({
      label: 'Database batch', name: 'db_batch_size', hint: `${worker.unit}s read and committed together, from ${BATCH_MIN} to ${BATCH_MAX}`,
      control: h('input', { type: 'number', inputmode: 'numeric', min: BATCH_MIN, max: BATCH_MAX, step: 1,
        placeholder: worker.raw.default_batch_size ?? '', value: saved.db_batch_size ?? '' }),
    });
    const workerOptions = optionFields(worker.options, 'options', saved.options || {});
    for (const o of workerOptions) fields[o.f.name] = o.f;
    const save = h('button', { type: 'submit' }, 'Save settings');
    const reset = h('button.secondary', { type: 'button', onclick: onReset, disabled: !saved.revision }, 'Remove saved settings');

    function collect() {
      const body = { expected_revision: revision };
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
      const eng = settable ? readOptions(engineOptions, 'engine_options') : { values: {}, errors: {} };
      Object.assign(errors, opts.errors, eng.errors);
      body.options = opts.values;
      body.engine_options = eng.values;
      return { body, errors };
    }

    async function onSubmit(ev) {
      ev.preventDefault();
      const { body, errors } = collect();
      if (Object.keys(errors).length) { showErrors(fields, { fields: errors }, formError); return; }
      showErrors(fields, null, formError);
      save.disabled = true;
      try {
        const out = await api.put(`/system/workers/${encodeURIComponent(name)}/settings`, body);
        revision = out.persisted?.revision ?? revision;
        reset.disabled = false;
        formError.textContent = '';
        announce(`Settings of ${worker.label} saved (revision ${revision}).`);
        replace(errorBox, h('div.notice.ok', { role: 'status' }, `Saved: revision ${revision}.`));
        renderWarnings(out.warnings);
      } catch (err) {
        if (err.status === 409) formError.textContent = `The settings changed meanwhile (now revision ${err.body?.revision ?? '?'}): reload the page to see them.`;
        else showErrors(fields, err, formError);
      } finally {
        save.disabled = false;
        ctx.poke();
      }
    }

    async function onReset() {
      try {
        await api.del(`/system/workers/${encodeURIComponent(name)}/settings?expected_revision=${revision}`);
        announce(`Saved settings of ${worker.label} removed: it runs on its defaults.`);
        replace(formBox);
        replace(errorBox, h('div.notice.ok', { role: 'status' }, 'Saved settings removed: the worker runs on its defaults.'));
        await refresh();
      } catch (err) {
        formError.textContent = `Could not remove the settings: ${err.message}`;
      }
    }

    return h('form.settings-form', { onsubmit: onSubmit, novalidate: true, 'aria-label': `Settings of ${worker.label}` },
      h('div.form-grid', ['engine_name', 'preset', 'db_batch_size'].filter((k) => fields[k]).map((k) => fields[k].el)),
      workerOptions.length ? h('fieldset', h('legend', 'Worker options'), h('div.form-grid', workerOptions.map(({ f }) => f.el))) : null,
      settable ? engineSet : h('p.small.muted', worker.engineSource === 'llm_check_rule'
        ? 'The engine is the active LLM_CHECK cleaning rule’s.' : 'This worker uses no engine.'),
      formError,
      h('div.actions', save, reset, h('span.small.muted', 'Empty fields use the defaults; the API validates before saving.')));
  }

  async function renderRevisions() {
    let data;
    try {
      data = await api.get(`/system/workers/${encodeURIComponent(name)}/settings/revisions?limit=50`);
    } catch (err) {
      replace(revisionsBox, h('p.notice.bad', `Could not load the revisions: ${err.message}`));
      return;
    }
    const list = data.revisions || [];
    if (!list.length) { replace(revisionsBox, h('p.muted', 'No revision yet: the settings were never changed.')); return; }
    replace(revisionsBox, h('div.table-wrap', h('table.revisions',
      h('thead', h('tr', ['Revision', 'When', 'Who', 'What changed'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', list.map((r, i) => h('tr', { dataset: { revision: r.revision } },
        h('td.num', String(r.revision)),
        h('td', timeEl(r.changed_at)),
        h('td', r.changed_by || '—'),
        h('td', changes(r, list[i + 1]))))))));
  }

  return { title: `Settings · ${name}`, refresh };
}

/** engine_name, preset, db_batch_size, options.k, engine_options.k -> value */
function flatten(settings) {
  const out = {};
  if (!settings) return out;
  for (const key of ['engine_name', 'preset', 'db_batch_size']) {
    if (settings[key] !== null && settings[key] !== undefined) out[key] = settings[key];
  }
  for (const group of ['options', 'engine_options']) {
    for (const [k, v] of Object.entries(settings[group] || {})) out[`${group}.${k}`] = v;
  }
  return out;
}

function changes(rev, older) {
  if (rev.action === 'DELETE') return h('span', 'removed the saved settings (back to the defaults)');
  const now = flatten(rev.settings);
  const before = flatten(older?.settings);
  const keys = [...new Set([...Object.keys(before), ...Object.keys(now)])].sort();
  const show = (v) => (v === undefined ? '—' : typeof v === 'object' ? JSON.stringify(v) : String(v));
  const diffs = keys.filter((k) => JSON.stringify(before[k]) !== JSON.stringify(now[k]));
  if (!diffs.length) return h('span.muted', 'saved without a change');
  return h('ul.changes', diffs.map((k) => h('li', h('code', k), `: ${show(before[k])} → ${show(now[k])}`)));
}
