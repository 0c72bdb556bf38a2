// Messages (an nsqpy addition: nsqd's /topic/peek, /channel/peek, /channel/requeue,
// /channel/remove and /topic/redrive): the "Messages" section of the topic and channel pages.
// A peek shows what each nsqd holds (queued, deferred, in flight) without consuming it;
// admins requeue or remove one message (channel page) and redrive the topic's backlog or a
// channel's queue to another topic (topic page), each confirmed, then the panel peeks again.

import { get, post } from './api.js';
import { config } from './config.js';
import { confirmAction } from './dialog.js';
import { h, mount } from './dom.js';
import { commafy, nanotohuman } from './format.js';
import { nodeLink, notice } from './widgets.js';

const SIZES = [10, 50, 100];
const FORMATS = [['text', 'Text'], ['hex', 'Hex'], ['json', 'JSON']];
/** characters of a body shown as text, bytes shown as hex */
const TEXT_LIMIT = 2000;
const HEX_LIMIT = 512;

const TABS = [
    { key: 'messages', label: 'Queued', empty: 'No queued messages.' },
    { key: 'deferred', label: 'Deferred', empty: 'No deferred messages.' },
    { key: 'in_flight', label: 'In flight', empty: 'No messages in flight.' },
];

// --- bodies ----------------------------------------------------------------------------------

/** The bytes of a base64 string. */
export function decodeBase64(b64) {
    const bin = atob(b64 || '');
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
}

/** UTF-8 text (invalid bytes as U+FFFD). */
export function asText(bytes) {
    return new TextDecoder('utf-8', { fatal: false }).decode(bytes);
}

/** A classic hex dump: offset, 16 bytes in hex, the printable ASCII. */
export function hexDump(bytes, limit = HEX_LIMIT) {
    const lines = [];
    const end = Math.min(bytes.length, limit);
    for (let off = 0; off < end; off += 16) {
        const row = bytes.subarray(off, Math.min(off + 16, end));
        const hex = Array.from(row, (b) => b.toString(16).padStart(2, '0'));
        const ascii = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : '.')).join('');
        const left = hex.slice(0, 8).join(' ');
        const right = hex.slice(8).join(' ');
        lines.push(`${off.toString(16).padStart(8, '0')}  ${left.padEnd(23)}  ${right.padEnd(23)}  |${ascii}|`);
    }
    return lines.join('\n');
}

/** The body as pretty JSON, or null when it is not JSON (nor UTF-8). */
export function asJson(bytes) {
    let text;
    try {
        text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    } catch (err) {
        return null;
    }
    try {
        return JSON.stringify(JSON.parse(text), null, 2);
    } catch (err) {
        return null;
    }
}

function bytesLabel(n) {
    return `${commafy(n)} byte${n === 1 ? '' : 's'}`;
}

/** A body shown as `format` (text, hex or json): always as text nodes, never as markup. */
export function bodyView(m, format) {
    const bytes = decodeBase64(m.body_base64);
    const size = h('small', { class: 'muted body-size' }, bytesLabel(bytes.length));
    if (format === 'hex') {
        const more = bytes.length > HEX_LIMIT ? `\n… the first ${commafy(HEX_LIMIT)} of ${bytesLabel(bytes.length)}` : '';
        return [h('pre', { class: 'body body-hex', 'data-body': 'hex' }, hexDump(bytes) + more), size];
    }
    const text = asText(bytes);
    const shown = text.length > TEXT_LIMIT ? `${text.slice(0, TEXT_LIMIT)}…` : text;
    if (format === 'json') {
        const pretty = asJson(bytes);
        if (pretty !== null) return [h('pre', { class: 'body body-json', 'data-body': 'json' }, pretty), size];
        return [
            h('div', { class: 'body-note', 'data-not-json': '' }, 'not JSON: shown as text'),
            h('pre', { class: 'body body-text', 'data-body': 'text' }, shown),
            size,
        ];
    }
    return [h('pre', { class: 'body body-text', 'data-body': 'text' }, shown), size];
}

// --- cells -------------------------------------------------------------------------------------

const pad = (v, n = 2) => String(v).padStart(n, '0');

/** Nanoseconds since the epoch as local "YYYY-MM-DD HH:MM:SS.mmm" (title: UTC ISO). */
function timeCell(ns, col) {
    if (!ns) return h('td', { 'data-col': col }, '–');
    const d = new Date(Number(ns) / 1e6);
    const text = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `
        + `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
    return h('td', { 'data-col': col }, h('time', { datetime: d.toISOString(), title: d.toISOString() }, text));
}

function dueCell(m) {
    if (m.delay_ms !== undefined && m.due === undefined) {
        return h('td', { 'data-col': 'due', title: 'the delay starts when a channel takes the message' },
            `delay ${nanotohuman(m.delay_ms * 1e6)}`);
    }
    const at = m.due ? new Date(Number(m.due) / 1e6).toISOString() : null;
    return h('td', { 'data-col': 'due', title: at }, `in ${nanotohuman((m.due_in_ms || 0) * 1e6)}`);
}

function clientCell(m) {
    const id = m.client_id || '';
    const remote = m.remote_address || '';
    return h('td', { 'data-col': 'client' }, id && id !== remote ? [id, ' ', h('small', { class: 'muted' }, remote)] : remote || '–');
}

function timeoutCell(m) {
    const at = m.deadline ? new Date(Number(m.deadline) / 1e6).toISOString() : null;
    return h('td', { 'data-col': 'timeout', title: at }, `in ${nanotohuman((m.timeout_ms || 0) * 1e6)}`);
}

// --- the section ---------------------------------------------------------------------------------

/**
 * The messages section: peek buttons, the body format, a per-node summary, tabs of message
 * rows labelled by node, and (admins) the row actions (channel) or the redrive form (topic).
 * After an action the panel peeks again and `onChange` (the page's tables) is called.
 */
export function messagesSection(view, { topic, channel = '', onChange = null }) {
    const api = `/peek/topics/${encodeURIComponent(topic)}${channel ? `/${encodeURIComponent(channel)}` : ''}`;
    const target = channel ? `${topic}/${channel}` : topic;
    const tabs = channel ? TABS : TABS.slice(0, 2);
    const state = { n: SIZES[0], nodes: null, tab: tabs[0].key, format: 'text', seq: 0 };

    const sizeButtons = SIZES.map((n) => h('button', {
        type: 'button',
        class: 'btn btn-xs',
        'data-peek': n,
        'aria-pressed': 'false',
        onclick: () => {
            mount(status);
            peek(n);
        },
    }, `Peek ${n}`));
    const formatButtons = FORMATS.map(([key, text]) => h('button', {
        type: 'button',
        class: 'btn btn-xs',
        'data-format': key,
        'aria-pressed': String(key === state.format),
        onclick: () => {
            state.format = key;
            for (const b of formatButtons) b.setAttribute('aria-pressed', String(b.dataset.format === key));
            draw();
        },
    }, text));
    const status = h('div', { class: 'peek-status', 'data-peek-status': '', 'aria-live': 'polite' });
    const body = h('div', { 'data-peek-body': '' },
        h('p', { class: 'muted' }, 'Peek to see the messages each nsqd holds, oldest first. Nothing is consumed.'));
    if (!config.isAdmin) {
        // bodies can be sensitive: with --admin-user, only admins see them
        return h('section', { 'aria-labelledby': 'msgs', 'data-section': 'messages' },
            h('h2', { id: 'msgs' }, 'Messages'),
            h('p', { class: 'muted', 'data-peek-denied': '' },
                'Only admin users may see the messages of a queue.'));
    }
    const section = h('section', { 'aria-labelledby': 'msgs', 'data-section': 'messages' },
        h('h2', { id: 'msgs' }, 'Messages'),
        h('div', { class: 'toolbar peek-toolbar' },
            h('div', { class: 'btn-group', role: 'group', 'aria-label': 'Peek' }, sizeButtons),
            h('div', { class: 'btn-group', role: 'group', 'aria-label': 'Show bodies as' },
                h('span', { class: 'muted' }, 'Bodies as'), formatButtons)),
        config.isAdmin && !channel ? redriveForm() : null,
        status,
        body);

    // --- peek ------------------------------------------------------------------------------------
    async function peek(n = state.n) {
        state.n = n;
        for (const b of sizeButtons) b.setAttribute('aria-pressed', String(Number(b.dataset.peek) === n));
        const seq = ++state.seq; // only the latest peek is drawn
        body.setAttribute('aria-busy', 'true');
        try {
            const data = await get(`${api}?n=${n}`, { signal: view.signal });
            if (seq !== state.seq) return;
            state.nodes = data.nodes || [];
            draw();
        } catch (err) {
            if ((err && err.name === 'AbortError') || seq !== state.seq) return;
            state.nodes = null;
            mount(body, h('div', { class: 'alert alert-error', role: 'alert', 'data-peek-error': '' }, err.message || String(err)));
        } finally {
            if (seq === state.seq) body.removeAttribute('aria-busy');
        }
    }

    function draw() {
        if (!state.nodes) return;
        const nodes = state.nodes;
        if (!nodes.length) {
            mount(body, notice('Notice', 'No nsqd has this topic.'));
            return;
        }
        const rows = {};
        for (const t of tabs) {
            rows[t.key] = nodes.flatMap((n) => ((n.peek && n.peek[t.key]) || []).map((m) => ({ node: n, m })));
        }
        mount(body, summary(nodes), tabList(rows), panel(rows[state.tab]));
    }

    function summary(nodes) {
        return h('div', { class: 'table-wrap' }, h('table', { class: 'table', 'data-table': 'peek-nodes' },
            h('thead', null, h('tr', null,
                h('th', { scope: 'col' }, 'NSQd Host'),
                h('th', { scope: 'col', class: 'num' }, 'Depth'),
                channel ? h('th', { scope: 'col', class: 'num' }, 'Deferred') : null,
                channel ? h('th', { scope: 'col', class: 'num' }, 'In-Flight') : null,
                h('th', { scope: 'col', class: 'num' }, 'Shown'))),
            h('tbody', null, nodes.map((n) => h('tr', { 'data-node': n.node },
                h('th', { scope: 'row' }, nodeLink(n.node, n.hostname)),
                n.error
                    ? h('td', { colspan: channel ? 4 : 2, class: 'settings-error', 'data-col': 'error' }, n.error)
                    : [
                        h('td', { class: 'num', 'data-col': 'depth' }, commafy(n.peek.depth)),
                        channel ? h('td', { class: 'num', 'data-col': 'deferred_count' }, commafy(n.peek.deferred_count)) : null,
                        channel ? h('td', { class: 'num', 'data-col': 'in_flight_count' }, commafy(n.peek.in_flight_count)) : null,
                        h('td', { class: 'num', 'data-col': 'shown' },
                            commafy(tabs.reduce((sum, t) => sum + (n.peek[t.key] || []).length, 0))),
                    ])))));
    }

    function tabList(rows) {
        const buttons = tabs.map((t) => h('button', {
            type: 'button',
            role: 'tab',
            id: `peek-tab-${t.key}`,
            class: 'tab',
            'data-tab': t.key,
            'aria-selected': String(t.key === state.tab),
            'aria-controls': 'peek-panel',
            tabindex: t.key === state.tab ? '0' : '-1',
            onclick: () => {
                state.tab = t.key;
                draw();
                const el = body.querySelector(`[data-tab="${t.key}"]`);
                if (el) el.focus();
            },
        }, t.label, ' ', h('span', { class: 'badge', 'data-count': '' }, String(rows[t.key].length))));
        const list = h('div', { class: 'tabs', role: 'tablist', 'aria-label': 'Messages by state' }, buttons);
        list.addEventListener('keydown', (ev) => {
            const i = tabs.findIndex((t) => t.key === state.tab);
            const step = { ArrowRight: 1, ArrowLeft: -1 }[ev.key];
            if (step === undefined) return;
            ev.preventDefault();
            buttons[(i + step + tabs.length) % tabs.length].click();
        });
        return list;
    }

    function panel(list) {
        const tab = tabs.find((t) => t.key === state.tab);
        const wrap = h('div', { id: 'peek-panel', role: 'tabpanel', 'aria-labelledby': `peek-tab-${tab.key}`, 'data-panel': tab.key });
        if (!list.length) {
            wrap.append(h('p', { class: 'muted', 'data-peek-none': '' }, tab.empty));
            return wrap;
        }
        const deferred = tab.key === 'deferred';
        const flying = tab.key === 'in_flight';
        const actions = config.isAdmin && channel && !flying;
        wrap.append(h('div', { class: 'table-wrap' }, h('table', { class: 'table peek-table', 'data-table': 'peek-messages' },
            h('thead', null, h('tr', null,
                h('th', { scope: 'col' }, 'NSQd Host'),
                h('th', { scope: 'col' }, 'ID'),
                h('th', { scope: 'col' }, 'Timestamp'),
                h('th', { scope: 'col', class: 'num' }, 'Attempts'),
                deferred ? h('th', { scope: 'col' }, 'Due') : null,
                flying ? h('th', { scope: 'col' }, 'Client') : null,
                flying ? h('th', { scope: 'col' }, 'Times Out') : null,
                h('th', { scope: 'col' }, 'Body'),
                actions ? h('th', { scope: 'col' }, h('span', { class: 'visually-hidden' }, 'Actions')) : null)),
            h('tbody', null, list.map(({ node, m }) => h('tr', { 'data-node': node.node, 'data-id': m.id },
                h('td', { 'data-col': 'node' }, nodeLink(node.node, node.hostname)),
                h('td', { 'data-col': 'id' }, h('code', null, m.id)),
                timeCell(m.timestamp, 'timestamp'),
                h('td', { class: 'num', 'data-col': 'attempts' }, commafy(m.attempts)),
                deferred ? dueCell(m) : null,
                flying ? clientCell(m) : null,
                flying ? timeoutCell(m) : null,
                h('td', { 'data-col': 'body', class: 'body-cell' }, bodyView(m, state.format)),
                actions ? h('td', { 'data-col': 'actions', class: 'row-actions' },
                    deferred ? h('button', {
                        type: 'button',
                        class: 'btn btn-xs btn-primary',
                        'data-action': 'requeue',
                        'aria-label': `Requeue message ${m.id} on ${node.node}`,
                        onclick: () => act('requeue', node.node, m.id),
                    }, 'Requeue') : null,
                    h('button', {
                        type: 'button',
                        class: 'btn btn-xs btn-danger',
                        'data-action': 'remove',
                        'aria-label': `Remove message ${m.id} on ${node.node}`,
                        onclick: () => act('remove', node.node, m.id),
                    }, 'Remove')) : null))))));
        return wrap;
    }

    // --- actions -----------------------------------------------------------------------------------

    /** Show an action's answer: `summary` when every node took it (with `each` node's
     * result when given), else every node's error or result. */
    function report(nodes, { summary, each, what }) {
        const failed = nodes.filter((n) => n.error);
        const list = () => h('ul', null, nodes.map((n) => h('li', { 'data-node': n.node },
            h('strong', null, n.node), ': ', n.error ? n.error : (each ? each(n) : 'done'))));
        if (!nodes.length) {
            mount(status, h('div', { class: 'alert alert-error', role: 'alert', 'data-peek-errors': '' }, 'No nsqd has this topic.'));
        } else if (failed.length) {
            mount(status, h('div', { class: 'alert alert-error', role: 'alert', 'data-peek-errors': '' },
                `Not every nsqd could ${what}:`, list()));
        } else {
            mount(status, h('div', { class: 'alert alert-success', role: 'status', 'data-peek-done': '' },
                summary, each ? list() : null));
        }
    }

    /** The page's tables again, after an action (their error is the page's). */
    function changed() {
        if (!onChange) return;
        Promise.resolve().then(onChange).catch((err) => {
            if (err && err.name === 'AbortError') return;
            view.error(err.message || String(err));
        });
    }

    function failure(err) {
        if (err && err.name === 'AbortError') return;
        mount(status, h('div', { class: 'alert alert-error', role: 'alert', 'data-peek-errors': '' }, err.message || String(err)));
    }

    async function act(action, node, id) {
        const requeue = action === 'requeue';
        const ok = await confirmAction({
            verb: action,
            target: `message ${id}`,
            danger: !requeue,
            detail: requeue
                ? `On ${node}: the deferred message of ${target} is delivered now instead of at its due time.`
                : `On ${node}: the message is deleted from ${target} and never delivered.`,
        });
        if (!ok) return;
        try {
            const data = await post(api, { action, node, id });
            report(data.nodes || [], { summary: `${requeue ? 'Requeued' : 'Removed'} message ${id} on ${node}.`, what: action });
        } catch (err) {
            failure(err);
            return;
        }
        changed();
        await peek();
    }

    function redriveForm() {
        const field = (id, text, input, hint) => h('div', { class: 'field' },
            h('label', { for: id }, text), input, hint ? h('small', { class: 'muted' }, hint) : null);
        const dest = h('input', { id: 'redrive-destination', name: 'destination', type: 'text', autocomplete: 'off', required: true });
        const count = h('input', { id: 'redrive-n', name: 'n', type: 'number', min: '1', step: '1', inputmode: 'numeric', placeholder: 'all' });
        const from = h('input', { id: 'redrive-channel', name: 'channel', type: 'text', autocomplete: 'off', placeholder: 'the topic itself' });
        const form = h('form', { class: 'peek-form', 'data-form': 'redrive' },
            h('h3', null, 'Redrive'),
            h('p', { class: 'muted' },
                `Publish messages held by ${topic} (or by one of its channels) to another topic on each nsqd, as new messages, and take them from here.`),
            h('div', { class: 'fields' },
                field('redrive-destination', 'Destination topic', dest),
                field('redrive-n', 'How many', count, 'in all; empty: every message'),
                field('redrive-channel', 'From channel', from, `empty: ${topic}'s own backlog`)),
            h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'btn btn-warning', 'data-action': 'redrive' }, 'Redrive')));
        form.addEventListener('submit', async (ev) => {
            ev.preventDefault();
            const destination = dest.value.trim();
            const n = count.value.trim() === '' ? null : Number(count.value);
            const ch = from.value.trim() || null;
            const source = ch ? `${topic}/${ch}` : topic;
            const ok = await confirmAction({
                verb: 'redrive',
                target: `${source} → ${destination}`,
                danger: true,
                button: 'Redrive',
                detail: n === null
                    ? `Every message queued in ${source}, on each nsqd, is published to ${destination} as a new message and removed from ${source}.`
                    : `Up to ${commafy(n)} message${n === 1 ? '' : 's'} queued in ${source} (in all: the nsqd in turn) ${n === 1 ? 'is' : 'are'} published to ${destination} as new messages and removed from ${source}.`,
            });
            if (!ok) return;
            try {
                const data = await post(api, { action: 'redrive', destination, n, channel: ch });
                report(data.nodes || [], {
                    summary: `Moved ${commafy(data.moved || 0)} message${data.moved === 1 ? '' : 's'} from ${source} to ${destination}.`,
                    each: (node) => `moved ${commafy(node.moved)}`,
                    what: 'redrive',
                });
            } catch (err) {
                failure(err);
                return;
            }
            changed();
            await peek();
        });
        return form;
    }

    return section;
}
