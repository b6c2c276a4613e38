// Change the password: forced at the first login (must_change_password), or chosen.
import { h, announce } from '../dom.js';
import * as api from '../api.js';
import { AUTH } from '../auth.js';
import { field, showErrors } from '../forms.js';

const MIN_LENGTH = 12;

export function mount(main, _route, ctx) {
  const forced = Boolean(ctx.user?.mustChangePassword);
  const current = field({
    label: 'Current password', name: 'current_password',
    control: h('input', { type: 'password', autocomplete: 'current-password', required: true }),
  });
  const next = field({
    label: 'New password', name: 'new_password',
    hint: `At least ${MIN_LENGTH} characters, not your e-mail address.`,
    control: h('input', { type: 'password', autocomplete: 'new-password', required: true, minlength: MIN_LENGTH }),
  });
  const confirm = field({
    label: 'Repeat the new password', name: 'confirm',
    control: h('input', { type: 'password', autocomplete: 'new-password', required: true }),
  });
  const fields = { current_password: current, new_password: next, confirm };
  const formError = h('div.form-error', { role: 'alert' });
  const submit = h('button', { type: 'submit' }, 'Change password');

  async function onSubmit(ev) {
    ev.preventDefault();
    showErrors(fields, null, formError);
    const errors = {};
    if (!current.input.value) errors.current_password = 'Enter your current password.';
    if (next.input.value.length < MIN_LENGTH) errors.new_password = `Use at least ${MIN_LENGTH} characters.`;
    else if (next.input.value === current.input.value) errors.new_password = 'Choose a password different from the current one.';
    if (confirm.input.value !== next.input.value) errors.confirm = 'The two new passwords differ.';
    if (Object.keys(errors).length) { showErrors(fields, { fields: errors }, formError); return; }
    submit.disabled = true;
    try {
      const data = await api.post(AUTH.password, {
        current_password: current.input.value, new_password: next.input.value,
      });
      ctx.setUser(data && (data.user || data.email) ? data : await api.get(AUTH.me));
      announce('Password changed');
      location.hash = '#/workers';
    } catch (err) {
      const e = err.status === 401 || err.status === 403
        ? { message: err.message, fields: err.fields && Object.keys(err.fields).length ? err.fields : { current_password: err.message } }
        : err;
      showErrors(fields, e, formError, { password: 'new_password' });
    } finally {
      submit.disabled = false;
    }
  }

  main.append(h('section.card.login', { 'aria-labelledby': 'pw-title' },
    h('h1#pw-title', forced ? 'Choose your password' : 'Change your password'),
    forced ? h('p.notice.warn', 'This is your first login: choose your own password before you go on.') : null,
    h('form', { onsubmit: onSubmit, novalidate: true }, current.el, next.el, confirm.el, formError, h('div.actions', submit))));
  return { title: 'Password' };
}
