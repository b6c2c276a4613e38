// Tiny DOM helpers. Text always goes through textContent, never innerHTML, so nothing the API
// returns (an error message, a worker's description) can inject markup.

/**
 * h("div.card#id", {attrs}, children...) -> Element
 * attrs: class, for, on* (functions), dataset (object), style (object of CSS properties, set through
 * the CSSOM: the CSP allows no style attribute), any other attribute; false/null skips it.
 */
export function h(tag, attrs, ...children) {
  const m = /^([a-z0-9-]+)((?:[.#][\w-]+)*)$/i.exec(tag);
  if (!m) throw new Error(`bad tag ${tag}`);
  const el = document.createElement(m[1]);
  for (const part of m[2].match(/[.#][\w-]+/g) || []) {
    if (part[0] === '.') el.classList.add(part.slice(1));
    else el.id = part.slice(1);
  }
  // Anything but a plain object is a child: a 0 (an exit code) too, which a truthiness test dropped.
  if (attrs !== null && attrs !== undefined && (typeof attrs !== 'object' || attrs instanceof Node || Array.isArray(attrs))) {
    children.unshift(attrs);
    attrs = null;
  }
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === 'class') {
      for (const c of String(value).split(/\s+/).filter(Boolean)) el.classList.add(c);
    } else if (key === 'style') {
      // Through the CSSOM, which the Content-Security-Policy allows; a style="" attribute it refuses.
      if (typeof value !== 'object') throw new Error('style must be an object of CSS properties');
      Object.assign(el.style, value);
    } else if (key === 'dataset') {
      Object.assign(el.dataset, value);
    } else if (key === 'value' && 'value' in el) {
      el.value = value;
    } else if (key === 'checked' || key === 'disabled' || key === 'selected' || key === 'hidden') {
      el[key] = Boolean(value);
      if (value === true && key !== 'checked' && key !== 'selected') el.setAttribute(key, '');
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/**
 * Replace el's children. A refresh rebuilds a card under the user's focus (a run's progress moves every
 * second): when the focus was inside, it moves to the rebuilt control that matches it, so a keyboard
 * user keeps their place instead of landing on the page's body (WCAG 2.4.3).
 */
export function replace(el, ...children) {
  const focused = document.activeElement;
  const key = focused && focused !== el && el.contains(focused) ? focusKey(focused) : null;
  clear(el);
  append(el, children);
  if (key !== null) {
    const match = [...el.querySelectorAll(focused.tagName)].find((c) => focusKey(c) === key);
    match?.focus({ preventScroll: true });
  }
  return el;
}

/** What names a control across a rebuild: its tag, type, name and accessible label or text. */
function focusKey(el) {
  return [el.tagName, el.getAttribute('type'), el.getAttribute('name'),
    el.getAttribute('aria-label') || el.textContent.trim()].join('|');
}

let uid = 0;
export function nextId(prefix = 'f') {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** Announce a message to screen readers (and show it in the status line). */
export function announce(message) {
  const live = document.getElementById('live');
  if (!live) return;
  live.textContent = '';
  // A new text node in a later frame makes assistive technology read it again.
  requestAnimationFrame(() => { live.textContent = message; });
}

/** A definition list from [label, value] pairs; null values are shown as "—". */
export function dl(pairs, cls = 'facts') {
  return h(`dl.${cls}`, pairs.filter(Boolean).map(([k, v]) => [
    h('dt', k),
    h('dd', v === null || v === undefined || v === '' ? h('span.muted', '—') : v),
  ]));
}
