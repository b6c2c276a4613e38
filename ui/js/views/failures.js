// Failures: errors grouped by fingerprint over N days. A group links to the runs it gathers.
import { h, replace } from '../dom.js';
import * as api from '../api.js';
import { field } from '../forms.js';
import { timeEl, number } from '../format.js';
import { items } from '../model.js';

const DAYS = [1, 7, 30, 90, 365];

export function mount(main, route, ctx) {
  const days = Number(route.params?.days) || 30;
  const daysSel = h('select', DAYS.map((d) => h('option', { value: d, selected: d === days }, d === 1 ? 'the last day' : `the last ${d} days`)));
  const daysField = field({ label: 'Period', name: 'days', control: daysSel });
  daysSel.addEventListener('change', () => ctx.navigate('failures', { days: daysSel.value }));
  const tbody = h('tbody');
  const status = h('p.muted.small', { role: 'status' });
  main.append(
    h('div.page-head',
      h('div', h('h1', 'Failures'), h('p', 'Errors grouped by fingerprint: the same cause, whatever its numbers, paths and ids.')),
      h('div.period', daysField.el)),
    status,
    h('div.table-wrap', h('table.stack',
      h('caption.visually-hidden', 'Error groups'),
      h('thead', h('tr', ['Fingerprint', 'Runs', 'Workers', 'First seen', 'Last seen', 'Sample error'].map((c) => h('th', { scope: 'col' }, c)))),
      tbody)));

  async function refresh() {
    const data = await api.get(`/system/failures${api.query({ days })}`);
    const groups = items(data, 'groups', 'failures');
    status.textContent = groups.length
      ? `${groups.length} group${groups.length === 1 ? '' : 's'} of errors in ${daysSel.selectedOptions[0].textContent}. Choose one to see its runs.`
      : '';
    replace(tbody, groups.length ? groups.map(row) : h('tr', h('td', { colspan: 6 }, h('div.empty', `No failure in ${daysSel.selectedOptions[0].textContent}.`))));
    return 'idle';
  }

  function row(g) {
    const fp = g.fingerprint ?? g.error_fingerprint;
    const href = `#/runs?fingerprint=${encodeURIComponent(fp)}`;
    const workers = g.workers || g.worker_names || [];
    const sample = g.sample_error ?? g.sample ?? g.error ?? '';
    const tr = h('tr.clickable', { dataset: { fingerprint: fp } },
      h('td', { 'data-label': 'Fingerprint' }, h('a.mono.small', { href }, fp)),
      h('td.num', { 'data-label': 'Runs' }, number(g.count ?? g.occurrences ?? g.runs)),
      h('td', { 'data-label': 'Workers' }, workers.map((w) => h('span.chip', w))),
      h('td.nowrap', { 'data-label': 'First seen' }, timeEl(g.first_seen ?? g.first_seen_at)),
      h('td.nowrap', { 'data-label': 'Last seen' }, timeEl(g.last_seen ?? g.last_seen_at)),
      h('td', { 'data-label': 'Sample error' }, h('pre.small', String(sample).split('\n').slice(0, 3).join('\n'))));
    // The whole row is a click target for the mouse; the link is the keyboard's.
    tr.addEventListener('click', (ev) => { if (!ev.target.closest('a')) location.hash = href; });
    return tr;
  }

  return { title: 'Failures', refresh };
}
