// Runs: the ledger, newest first, filtered by worker, status, trigger and error fingerprint, with
// keyset pagination ("Older runs"). The filters live in the URL, so a failure group links here.
import { h, replace, announce } from '../dom.js';
import * as api from '../api.js';
import { field } from '../forms.js';
import { timeEl, duration, shortId } from '../format.js';
import { items, statusBadge, STATUSES, TRIGGERS, activityOf, progressOf, triggerText } from '../model.js';

const PAGE = 50;

export function mount(main, route, ctx) {
  const params = route.params || {};
  const workerSel = h('select', h('option', { value: '' }, 'All workers'));
  const statusSel = h('select', h('option', { value: '' }, 'Any status'), STATUSES.map((s) => h('option', { value: s }, s)));
  const triggerSel = h('select', h('option', { value: '' }, 'Any trigger'), TRIGGERS.map((s) => h('option', { value: s }, triggerText(s))));
  const fpInput = h('input', { type: 'search', placeholder: 'error fingerprint', spellcheck: 'false' });
  const filters = {
    worker: field({ label: 'Worker', name: 'worker', control: workerSel }),
    status: field({ label: 'Status', name: 'status', control: statusSel }),
    trigger: field({ label: 'Trigger', name: 'trigger', control: triggerSel }),
    fingerprint: field({ label: 'Fingerprint', name: 'fingerprint', control: fpInput }),
  };
  // A worker named in the URL shows even before the catalogue has loaded.
  if (params.worker) workerSel.append(h('option', { value: params.worker }, params.worker));
  for (const [k, f] of Object.entries(filters)) f.input.value = params[k] || '';

  const tbody = h('tbody');
  const more = h('button.secondary', { type: 'button', hidden: true, onclick: () => loadMore() }, 'Older runs');
  const status = h('p.muted.small', { role: 'status' });
  const table = h('table.stack',
    h('caption.visually-hidden', 'Runs, newest first'),
    h('thead', h('tr', ['Run', 'Worker', 'Status', 'Trigger', 'Requested by', 'Queued', 'Duration', 'Attempt', 'Exit / error']
      .map((c) => h('th', { scope: 'col' }, c)))),
    tbody);

  function apply(ev) {
    ev?.preventDefault();
    const next = {};
    for (const [k, f] of Object.entries(filters)) if (f.input.value.trim()) next[k] = f.input.value.trim();
    ctx.navigate('runs', next);
  }
  function reset() { ctx.navigate('runs', {}); }

  // A run id as people see it (its last 12 digits), or a whole one, or an old log's first 8: the API finds it.
  const goInput = h('input', { type: 'search', placeholder: 'e.g. 7d4e9a1c2b3f', spellcheck: 'false', autocomplete: 'off' });
  const go = field({ label: 'Run id', name: 'run_id', control: goInput });
  function goTo(ev) {
    ev?.preventDefault();
    const typed = goInput.value.trim().replace(/[^0-9a-fA-F-]/g, '');
    if (typed.replace(/-/g, '').length < 8) { go.setError('Type at least 8 hex digits of the run id.'); return; }
    ctx.navigate(`runs/${typed.toLowerCase()}`);
  }

  main.append(
    h('div.page-head', h('div', h('h1', 'Runs'), h('p', 'Every run of every worker: the ledger is the queue.'))),
    h('form.filters.card', { onsubmit: goTo, role: 'search', 'aria-label': 'Find a run by its id' },
      go.el, h('div.actions', h('button', { type: 'submit' }, 'Go to run'))),
    h('form.filters.card', { onsubmit: apply, role: 'search', 'aria-label': 'Filter the runs' },
      Object.values(filters).map((f) => f.el),
      h('div.actions', h('button', { type: 'submit' }, 'Filter'), h('button.secondary', { type: 'button', onclick: reset }, 'Clear'))),
    status,
    h('div.table-wrap', table),
    h('div.pager', more));

  for (const sel of [workerSel, statusSel, triggerSel]) sel.addEventListener('change', apply);

  // Worker names for the filter (cheap enough: one call at mount).
  api.get('/system/workers').then((data) => {
    const names = items(data, 'workers').map((w) => w.name).filter((n) => n && n !== params.worker);
    for (const n of names) workerSel.append(h('option', { value: n }, n));
    workerSel.value = params.worker || '';
  }).catch(() => {});

  let cursor = null;
  let rows = [];
  let firstPage = [];
  let older = [];

  function apiParams(extra) {
    return api.query({
      worker: params.worker, status: params.status, trigger: params.trigger, fingerprint: params.fingerprint,
      limit: PAGE, ...extra,
    });
  }

  function render() {
    replace(tbody, rows.length ? rows.map(row) : h('tr', h('td', { colspan: 9 }, h('div.empty', 'No run matches these filters.'))));
    const active = Object.entries(params).filter(([k, v]) => v && k in filters).map(([k, v]) => `${k} = ${v}`);
    status.textContent = `${rows.length} run${rows.length === 1 ? '' : 's'} shown${active.length ? ` · filtered by ${active.join(', ')}` : ''}`;
    more.hidden = !cursor;
  }

  function row(r) {
    const p = progressOf(r);
    const exit = [r.exit_reason, r.exit_code !== null && r.exit_code !== undefined ? `code ${r.exit_code}` : null,
      r.exit_signal ? `signal ${r.exit_signal}` : null].filter(Boolean).join(', ');
    const errLine = r.error ? r.error.split('\n')[0] : '';
    return h('tr', { dataset: { runId: r.run_id, status: r.status } },
      h('td', { 'data-label': 'Run' }, h('a.mono', { href: `#/runs/${r.run_id}` }, shortId(r.run_id))),
      h('td', { 'data-label': 'Worker' }, r.worker_name),
      h('td', { 'data-label': 'Status' }, statusBadge(r.status),
        r.status === 'RUNNING' && p.total ? h('span.small.muted', ` ${p.done}/${p.total}`) : null),
      h('td', { 'data-label': 'Trigger' }, triggerText(r.trigger)),
      h('td', { 'data-label': 'Requested by' }, r.requested_by || h('span.muted', '—')),
      h('td.nowrap', { 'data-label': 'Queued' }, timeEl(r.queued_at)),
      h('td.num', { 'data-label': 'Duration' }, r.duration_ms !== null && r.duration_ms !== undefined ? duration(r.duration_ms) : '—'),
      h('td.num', { 'data-label': 'Attempt' }, r.attempt ?? 1),
      h('td', { 'data-label': 'Exit / error' },
        exit ? h('div.small', exit) : null,
        errLine ? h('div.small.muted', { title: r.error }, errLine.length > 90 ? `${errLine.slice(0, 90)}…` : errLine) : null,
        r.error_fingerprint ? h('a.small', { href: `#/runs?fingerprint=${encodeURIComponent(r.error_fingerprint)}`, title: r.error_fingerprint }, 'same fingerprint') : null));
  }

  function combine() {
    const ids = new Set(firstPage.map((r) => r.run_id));
    rows = firstPage.concat(older.filter((r) => !ids.has(r.run_id)));
  }

  async function refresh() {
    // Re-read the first page; the older pages already loaded stay below it.
    const data = await api.get(`/system/runs${apiParams()}`);
    firstPage = items(data, 'runs');
    if (!older.length) cursor = nextCursor(data);
    combine();
    render();
    return activityOf(rows.map((r) => r.status));
  }

  async function loadMore() {
    if (!cursor) return;
    more.disabled = true;
    try {
      const data = await api.get(`/system/runs${apiParams(cursorParam(cursor))}`);
      const page = items(data, 'runs');
      older = older.concat(page);
      cursor = nextCursor(data);
      combine();
      render();
      announce(`${page.length} older runs loaded`);
    } finally {
      more.disabled = false;
    }
  }

  return { title: 'Runs', refresh };
}

function nextCursor(data) {
  if (!data || Array.isArray(data)) return null;
  return data.next_cursor ?? data.next_before ?? data.next ?? data.cursor ?? null;
}

function cursorParam(cursor) {
  if (typeof cursor === 'object') return cursor;
  return { cursor };
}
