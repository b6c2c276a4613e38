// Form helpers: a labelled field with a hint and an error slot tied by aria-describedby, and the
// mapping of an API error (422 per field, or one message) onto a form.
import { h, nextId } from './dom.js';

/**
 * field({label, name, control, hint}) -> {el, input, setError(msg)}
 * ``control`` is an <input>/<select>; it gets an id, a name and aria-describedby here.
 */
export function field({ label, name, control, hint, cls = '' }) {
  const id = control.id || nextId(name || 'field');
  control.id = id;
  if (name) control.name = name;
  const hintId = `${id}-hint`;
  const errId = `${id}-error`;
  const describedBy = [hint ? hintId : null, errId].filter(Boolean).join(' ');
  control.setAttribute('aria-describedby', describedBy);
  const isCheck = control.type === 'checkbox';
  const error = h('div.error', { id: errId, 'data-error-for': name || '' });
  const el = isCheck
    ? h(`div.field${cls}`, h('label.check', { for: id }, control, label), hint && h('div.hint', { id: hintId }, hint), error)
    : h(`div.field${cls}`, h('label', { for: id }, label), control, hint && h('div.hint', { id: hintId }, hint), error);
  const setError = (msg) => {
    error.textContent = msg || '';
    if (msg) control.setAttribute('aria-invalid', 'true');
    else control.removeAttribute('aria-invalid');
  };
  return { el, input: control, setError, name };
}

/**
 * 'true' when an error says the API could not be reached or failed (no answer, a 5xx): its notice is
 * removed by the shell as soon as the API answers again (issue 28, 2); a refusal (4xx) stays.
 */
export function unreachable(err) {
  return err && (err.status === 0 || err.status >= 500) ? 'true' : 'false';
}

/** Show ``ApiError.fields`` beside their fields; what matches no field goes to ``formError``. */
export function showErrors(fields, err, formError, aliases = {}) {
  for (const f of Object.values(fields)) f.setError('');
  const unmatched = [];
  const entries = Object.entries(err?.fields || {});
  for (const [key, msg] of entries) {
    const target = fields[key] || fields[aliases[key]] || fields[key.split('.').slice(-1)[0]]
      || fields[key.replace(/^request\./, '')];
    if (target) target.setError(msg);
    else unmatched.push(`${key}: ${msg}`);
  }
  let summary = '';
  if (err) {
    if (!entries.length) summary = err.message;
    else if (unmatched.length) summary = unmatched.join('; ');
    else summary = 'Please correct the fields marked below.';
  }
  formError.textContent = summary;
  formError.dataset.transient = unreachable(err);
  const firstInvalid = Object.values(fields).find((f) => f.input.getAttribute('aria-invalid') === 'true');
  if (firstInvalid) firstInvalid.input.focus();
  return !err;
}
