// Log in. A first login with must_change_password goes on to the password page.
import { h, announce } from '../dom.js';
import * as api from '../api.js';
import { AUTH } from '../auth.js';
import { field, showErrors } from '../forms.js';

export function mount(main, _route, ctx) {
  const email = field({
    label: 'E-mail', name: 'email',
    control: h('input', { type: 'email', autocomplete: 'username', required: true, autocapitalize: 'none', spellcheck: 'false' }),
  });
  const password = field({
    label: 'Password', name: 'password',
    control: h('input', { type: 'password', autocomplete: 'current-password', required: true }),
  });
  const formError = h('div.form-error', { role: 'alert' });
  const submit = h('button', { type: 'submit' }, 'Log in');
  const fields = { email, password };

  async function onSubmit(ev) {
    ev.preventDefault();
    showErrors(fields, null, formError);
    if (!email.input.value.trim()) { email.setError('Enter your e-mail address.'); email.input.focus(); return; }
    if (!password.input.value) { password.setError('Enter your password.'); password.input.focus(); return; }
    submit.disabled = true;
    try {
      const data = await api.post(AUTH.login, { email: email.input.value.trim(), password: password.input.value }, { quiet401: true });
      // The login answer carries the user (or /me does).
      ctx.setUser(data && (data.user || data.email) ? data : await api.get(AUTH.me));
      announce('Logged in');
      ctx.afterLogin();
    } catch (err) {
      password.input.value = '';
      let e = err;
      if (err.status === 401) e = { message: 'The e-mail or the password is wrong.', fields: {} };
      else if (err.status === 429) e = { message: `Too many attempts. ${err.message}`, fields: {} };
      else if (err.status === 423) e = { message: `This account is locked for now. ${err.message}`, fields: {} };
      showErrors(fields, e, formError);
      if (!Object.keys(e.fields || {}).length) password.input.focus();
    } finally {
      submit.disabled = false;
    }
  }

  main.append(h('section.card.login', { 'aria-labelledby': 'login-title' },
    h('h1#login-title', 'Log in'),
    h('p.muted', 'The operations panel of the Scrinalia runners.'),
    h('form', { onsubmit: onSubmit, novalidate: true }, email.el, password.el, formError, h('div.actions', submit))));
  return { title: 'Log in' };
}
