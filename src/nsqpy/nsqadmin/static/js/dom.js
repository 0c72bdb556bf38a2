// A tiny element builder: text always goes in as text nodes (never parsed as HTML).

const SVG_NS = 'http://www.w3.org/2000/svg';

function append(el, children) {
    for (const child of children) {
        if (child === null || child === undefined || child === false || child === true) continue;
        if (Array.isArray(child)) append(el, child);
        else if (child instanceof Node) el.appendChild(child);
        else el.appendChild(document.createTextNode(String(child)));
    }
}

function setAttrs(el, attrs, svg) {
    for (const [key, value] of Object.entries(attrs || {})) {
        if (value === null || value === undefined || value === false) continue;
        if (key.startsWith('on') && typeof value === 'function') {
            el.addEventListener(key.slice(2), value);
        } else if (key === 'class' && Array.isArray(value)) {
            const names = value.filter(Boolean).join(' ');
            if (names) el.setAttribute('class', names);
        } else if (key === 'dataset') {
            for (const [k, v] of Object.entries(value)) {
                if (v !== null && v !== undefined) el.dataset[k] = String(v);
            }
        } else if (!svg && (key === 'value' || key === 'checked' || key === 'selected')) {
            el[key] = value;
        } else {
            el.setAttribute(key, value === true ? '' : String(value));
        }
    }
}

/** h('a', {href: '/x', class: 'link'}, 'text', child, [more]) → an HTML element. */
export function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs, false);
    append(el, children);
    return el;
}

/** s('path', {d: 'M0 0'}) → an SVG element. */
export function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    setAttrs(el, attrs, true);
    append(el, children);
    return el;
}

/** Replace the children of `el`. */
export function mount(el, ...children) {
    el.replaceChildren();
    append(el, children);
    return el;
}
