// Schedules: what the scheduler enqueues and when; the next tick and the last outcome (a refused
// tick says why); add (one per worker), enable/disable, remove.
import { h, replace, announce } from '../dom.js';
import * as api from '../api.js';
import { field, showErrors, unreachable } from '../forms.js';
import { timeEl, duration, shortId, plural } from '../format.js';
import { items, statusBadge } from '../model.js';

const REFUSED = 'refused: ';

function isEnded(run) {
  return Boolean(run) && run.status !== 'QUEUED' && run.status !== 'RUNNING';
}

export function mount(main, route, ctx) {
  const summary = h('p');
  const errorBox = h('div');
  const tableBox = h('div');
  const formBox = h('div');
  main.append(
    h('div.page-head', h('div', h('h1', 'Schedules'), summary)),
    errorBox,
    h('section.card', { 'aria-labelledby': 'sched-list-h' }, h('h2#sched-list-h', 'Every schedule'), tableBox),
    formBox,
  );
  const confirming = new Set();
  let schedules = [];
  let workers = [];
  const lastRuns = new Map(); // run id -> {status, exit_reason}; an ended run is read once
  const highlight = route.params?.schedule ? Number(route.params.schedule) : null;

  async function refresh() {
    const [data, wdata] = await Promise.all([api.get('/system/schedules'), workers.length ? null : api.get('/system/workers')]);
    schedules = items(data, 'schedules');
    await readLastRuns();
    if (wdata) workers = items(wdata, 'workers').map((w) => ({ name: w.name, label: w.label || w.name }));
    render();
    if (ctx.canOperate() && !formBox.firstChild) replace(formBox, addForm());
    return 'idle';
  }

  async function readLastRuns() {
    const wanted = schedules.map((s) => s.last_run_id).filter((id) => id && !isEnded(lastRuns.get(id)));
    await Promise.all(wanted.map(async (id) => {
      try {
        const r = await api.get(`/system/runs/${id}`);
        const run = r?.run && typeof r.run === 'object' ? r.run : r;
        lastRuns.set(id, { status: run.status, exit_reason: run.exit_reason || null });
      } catch (err) {
        if (err.status === 401 || unreachable(err) === 'true') throw err;
      }
    }));
  }

  function render() {
    const enabled = schedules.filter((s) => s.enabled).length;
    const quarantined = schedules.filter((s) => s.quarantined).length;
    summary.textContent = `${plural(schedules.length, 'schedule')} · ${enabled} enabled${quarantined ? ` · ${quarantined} quarantined` : ''} · one per worker`;
    if (!schedules.length) {
      replace(tableBox, h('p.muted', ctx.canOperate() ? 'No schedule yet: add one below.' : 'No schedule yet.'));
      return;
    }
    const cols = ['Worker', 'Every', 'State', 'Next tick', 'Last outcome', ctx.canOperate() ? 'Actions' : null].filter(Boolean);
    replace(tableBox, h('div.table-wrap', h('table.stack.schedules',
      h('thead', h('tr', cols.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', schedules.map(row)))));
    if (highlight !== null) tableBox.querySelector(`tr[data-schedule="${highlight}"]`)?.scrollIntoView({ block: 'center' });
  }

  function row(s) {
    const refused = (s.last_outcome || '').startsWith(REFUSED);
    return h('tr', { dataset: { schedule: s.id, worker: s.worker_name, state: stateOf(s) }, class: s.id === highlight ? 'highlight' : '' },
      h('td', { 'data-label': 'Worker' }, h('a', { href: `#/runs?worker=${encodeURIComponent(s.worker_name)}` }, s.worker_name),
        h('div.small.muted', `schedule ${s.id}`)),
      h('td', { 'data-label': 'Every' }, duration(s.interval_seconds * 1000)),
      h('td', { 'data-label': 'State' }, h('span.badge', { class: stateOf(s) }, stateOf(s)),
        s.quarantine ? quarantineText(s.quarantine) : null),
      h('td', { 'data-label': 'Next tick' }, s.enabled ? timeEl(s.next_run_at) : h('span.muted', stateOf(s))),
      h('td', { 'data-label': 'Last outcome' },
        s.last_outcome
          ? h('span', { class: refused ? 'outcome refused' : 'outcome' }, refused ? h('strong', 'refused: ') : null,
            refused ? s.last_outcome.slice(REFUSED.length) : outcomeText(s))
          : h('span.muted', 'not ticked yet'),
        s.last_tick_at ? h('span.muted.small', ' · ', timeEl(s.last_tick_at)) : null,
        s.last_run_id ? h('span.small', ' · ', h('a.mono', { href: `#/runs/${s.last_run_id}` }, `run ${shortId(s.last_run_id)}`)) : null),
      ctx.canOperate() ? h('td.actions', { 'data-label': 'Actions' }, actions(s)) : null);
  }

  // "enqueued" says what the tick did, not how the run went: a quarantined schedule whose runs all
  // failed said "Last outcome: enqueued" (issue 28, 6). The run's own end is the outcome.
  function outcomeText(s) {
    const run = s.last_run_id ? lastRuns.get(s.last_run_id) : null;
    if (s.last_outcome === 'enqueued' && run) {
      if (run.status === 'QUEUED' || run.status === 'RUNNING') return h('span', `its run is ${run.status.toLowerCase()} `, statusBadge(run.status));
      return h('span', `its run ended `, statusBadge(run.status), run.exit_reason ? h('span.muted', ` (${run.exit_reason})`) : null);
    }
    if (s.last_outcome === 'skipped-busy') return 'skipped: the worker was busy';
    return s.last_outcome;
  }

  function stateOf(s) {
    if (s.quarantined) return 'quarantined';
    return s.enabled ? 'enabled' : 'disabled';
  }

  // Why the scheduler paused it: the reason, the fingerprint (a link to its runs) and the last failed run.
  function quarantineText(q) {
    return h('div.quarantine.small',
      h('div', q.reason || 'crash loop'),
      q.fingerprint ? h('div', 'Error: ', h('code.fingerprint', q.fingerprint), ' ',
        h('a', { href: `#/runs?fingerprint=${encodeURIComponent(q.fingerprint)}` }, 'its runs')) : null,
      h('div.muted', 'since ', timeEl(q.quarantined_at),
        q.run_id ? [' · ', h('a.mono', { href: `#/runs/${q.run_id}` }, `run ${shortId(q.run_id)}`)] : null));
  }

  function actions(s) {
    if (confirming.has(s.id)) {
      return [h('span.small', `Remove the ${s.worker_name} schedule?`),
        h('button.danger', { type: 'button', onclick: () => remove(s) }, 'Yes, remove it'),
        h('button.secondary', { type: 'button', onclick: () => { confirming.delete(s.id); render(); } }, 'No')];
    }
    return [
      s.quarantined
        ? h('button', { type: 'button', onclick: () => resume(s), 'aria-label': `Resume the ${s.worker_name} schedule` }, 'Resume')
        : h('button.secondary', { type: 'button', onclick: () => setEnabled(s, !s.enabled), 'aria-label': `${s.enabled ? 'Disable' : 'Enable'} the ${s.worker_name} schedule` },
          s.enabled ? 'Disable' : 'Enable'),
      h('button.danger', { type: 'button', 'aria-label': `Remove the ${s.worker_name} schedule`,
        onclick: () => { confirming.add(s.id); render(); tableBox.querySelector(`tr[data-schedule="${s.id}"] button.danger`)?.focus(); } }, 'Remove'),
    ];
  }

  async function setEnabled(s, enabled) {
    try {
      await api.request('PATCH', `/system/schedules/${s.id}`, { enabled });
      announce(`The ${s.worker_name} schedule is ${enabled ? 'enabled' : 'disabled'}.`);
      replace(errorBox);
    } catch (err) {
      replace(errorBox, h('div.notice.bad', { role: 'alert', dataset: { transient: unreachable(err) } }, `Could not change the schedule: ${err.message}`));
    }
    ctx.poke();
  }

  async function resume(s) {
    try {
      await api.request('POST', `/system/schedules/${s.id}/resume`);
      announce(`The ${s.worker_name} schedule is resumed.`);
      replace(errorBox);
    } catch (err) {
      replace(errorBox, h('div.notice.bad', { role: 'alert', dataset: { transient: unreachable(err) } }, `Could not resume the schedule: ${err.message}`));
    }
    ctx.poke();
  }

  async function remove(s) {
    confirming.delete(s.id);
    try {
      await api.del(`/system/schedules/${s.id}`);
      announce(`The ${s.worker_name} schedule is removed.`);
      replace(errorBox);
    } catch (err) {
      replace(errorBox, h('div.notice.bad', { role: 'alert', dataset: { transient: unreachable(err) } }, `Could not remove the schedule: ${err.message}`));
    }
    ctx.poke();
  }

  function addForm() {
    const formError = h('div.form-error', { role: 'alert' });
    const fields = {
      worker_name: field({ label: 'Worker', name: 'worker_name', cls: '.field-worker',
        control: h('select', workers.map((w) => h('option', { value: w.name }, w.label === w.name ? w.name : `${w.label} (${w.name})`))) }),
      minutes: field({ label: 'Every (minutes)', name: 'interval_seconds', hint: 'at least 1',
        control: h('input', { type: 'number', min: 1, step: 1, inputmode: 'numeric', value: '60' }) }),
      request: field({ label: 'Request (JSON)', name: 'request', hint: 'e.g. {"db_batch_size": 16}; empty: the saved settings',
        control: h('textarea', { rows: 2, spellcheck: 'false', placeholder: '{}' }) }),
    };
    fields.interval_seconds = fields.minutes; // a 422 on interval_seconds lands on the minutes field
    const submit = h('button', { type: 'submit' }, 'Add schedule');

    async function onSubmit(ev) {
      ev.preventDefault();
      const minutes = Number(fields.minutes.input.value);
      const errors = {};
      if (!Number.isInteger(minutes) || minutes < 1) errors.minutes = 'Enter a whole number of minutes, at least 1.';
      let request = {};
      const raw = fields.request.input.value.trim();
      if (raw) {
        try {
          request = JSON.parse(raw);
          if (typeof request !== 'object' || request === null || Array.isArray(request)) throw new Error();
        } catch { errors.request = 'Enter a JSON object.'; }
      }
      if (Object.keys(errors).length) { showErrors(fields, { fields: errors }, formError); return; }
      showErrors(fields, null, formError);
      submit.disabled = true;
      try {
        const worker = fields.worker_name.input.value;
        await api.post('/system/schedules', { worker_name: worker, interval_seconds: minutes * 60, request });
        announce(`Schedule added for ${worker}.`);
        formError.textContent = '';
      } catch (err) {
        if (err.status === 409) formError.textContent = err.message;
        else showErrors(fields, err, formError);
      } finally {
        submit.disabled = false;
        ctx.poke();
      }
    }

    return h('section.card.section', { 'aria-labelledby': 'sched-add-h' }, h('h2#sched-add-h', 'Add a schedule'),
      h('p.small.muted', 'One schedule per worker (two would take turns at its one slot). Its request is validated like a run’s, now and at every tick.'),
      h('form.schedule-form', { onsubmit: onSubmit, novalidate: true, 'aria-label': 'Add a schedule' },
        h('div.form-grid', fields.worker_name.el, fields.minutes.el, fields.request.el), formError, h('div.actions', submit)));
  }

  return { title: 'Schedules', refresh };
}
