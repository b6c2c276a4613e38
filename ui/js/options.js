// Option fields from a signature (a worker's options, an engine's options), for the Run form and the
// Settings page: one control per option by its type, and the reading of what was typed back into
// values (with the same bounds the API checks; the API's 422 stays the judge).
import { h } from './dom.js';
import { field } from './forms.js';

const NUMERIC = ['int', 'integer', 'float', 'number'];

function text(value) {
  if (value === null || value === undefined) return '';
  return typeof value === 'object' ? JSON.stringify(value) : String(value);
}

/** The control for one option; ``initial`` pre-fills it (a saved setting), else it shows the default. */
function control(o, initial) {
  const value = initial === undefined || initial === null ? '' : text(initial);
  if (o.type === 'bool' || o.type === 'boolean') {
    return h('select',
      h('option', { value: '' }, `Default (${o.default === null ? 'none' : o.default ? 'yes' : 'no'})`),
      h('option', { value: 'true', selected: value === 'true' }, 'Yes'),
      h('option', { value: 'false', selected: value === 'false' }, 'No'));
  }
  if (o.choices) {
    return h('select', h('option', { value: '' }, `Default (${o.default ?? 'none'})`),
      o.choices.map((c) => h('option', { value: String(c), selected: value === String(c) }, String(c))));
  }
  if (NUMERIC.includes(o.type)) {
    return h('input', {
      type: 'number', step: o.type.startsWith('int') ? 1 : 'any', min: o.min ?? false, max: o.max ?? false,
      placeholder: o.default ?? '', inputmode: o.type.startsWith('int') ? 'numeric' : 'decimal', value,
    });
  }
  return h('input', { type: 'text', placeholder: text(o.default), spellcheck: 'false', value });
}

/**
 * An option's label in words: "min_score" -> "Min score". An engine's ``batch_size`` is the model's batch,
 * which a plain "Batch size" would confuse with the run's database batch (issue 28, 7).
 */
export function optionLabel(name, prefix = 'options') {
  if (prefix === 'engine_options' && name === 'batch_size') return 'Model batch size';
  const words = String(name).replaceAll('_', ' ').replaceAll('-', ' ').trim();
  return words ? words[0].toUpperCase() + words.slice(1) : String(name);
}

/** "from 0 to 1", "at least 1", "at most 60": a bound in words, not "0–1". */
function rangeText(o) {
  if (o.min !== null && o.max !== null) return `from ${o.min} to ${o.max}`;
  if (o.min !== null) return `at least ${o.min}`;
  if (o.max !== null) return `at most ${o.max}`;
  return null;
}

const KIND = { path: 'a directory on the runner', list: 'a JSON list', dict: 'a JSON object', bool: 'yes or no', boolean: 'yes or no' };

/**
 * optionFields(specs, prefix, initial) -> [{spec, f}]: one labelled field per option, named
 * ``${prefix}.${name}`` (so a 422 on "engine_options.model" lands beside its field). The hint is the
 * description, the bound and whether it is required, in words; the raw name stays in the field's name.
 */
export function optionFields(specs, prefix, initial = {}) {
  return specs.map((o) => {
    const hint = [o.required ? 'Required' : null, o.description, KIND[o.type] || null, rangeText(o)].filter(Boolean).join(' · ');
    const f = field({ label: optionLabel(o.name, prefix), name: `${prefix}.${o.name}`, hint, control: control(o, initial?.[o.name]) });
    return { spec: o, f };
  });
}

/** Read the fields back: {values, errors}; an empty field is left out (the layers below apply). */
export function readOptions(list, prefix) {
  const values = {};
  const errors = {};
  for (const { spec, f } of list) {
    const raw = f.input.value.trim();
    if (raw === '') continue;
    const key = `${prefix}.${spec.name}`;
    if (spec.type === 'bool' || spec.type === 'boolean') values[spec.name] = raw === 'true';
    else if (spec.choices) values[spec.name] = spec.choices.find((c) => String(c) === raw) ?? raw;
    else if (NUMERIC.includes(spec.type)) {
      const n = Number(raw);
      if (!Number.isFinite(n)) errors[key] = 'Enter a number.';
      else if (spec.type.startsWith('int') && !Number.isInteger(n)) errors[key] = 'Enter a whole number.';
      else if (spec.min !== null && n < spec.min) errors[key] = `At least ${spec.min}.`;
      else if (spec.max !== null && n > spec.max) errors[key] = `At most ${spec.max}.`;
      else values[spec.name] = n;
    } else if (spec.type === 'list' || spec.type === 'dict') {
      try {
        const v = JSON.parse(raw);
        if (spec.type === 'list' ? !Array.isArray(v) : (typeof v !== 'object' || v === null || Array.isArray(v))) throw new Error();
        values[spec.name] = v;
      } catch {
        errors[key] = spec.type === 'list' ? 'Enter a JSON list, e.g. ["a", "b"].' : 'Enter a JSON object, e.g. {"k": 1}.';
      }
    } else values[spec.name] = raw;
  }
  return { values, errors };
}
