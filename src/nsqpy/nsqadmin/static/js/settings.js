// Queue settings (an nsqpy addition: nsqd's /topic/config and /channel/config): the
// "Settings" section of the topic and channel pages, each nsqd's settings of the queue, and
// for admins one dialog that sets them on every nsqd that has the topic (as pause does),
// showing each node's answer.

import { get, post } from './api.js';
import { config } from './config.js';
import { h, mount } from './dom.js';
import { commafy } from './format.js';
import { nodeLink, notice } from './widgets.js';

const TOPIC_KEYS = ['max_depth', 'max_bytes', 'overflow', 'max_age'];
const CHANNEL_KEYS = [...TOPIC_KEYS, 'max_attempts', 'dead_letter_topic', 'max_rate'];

const FIELDS = {
    max_depth: { label: 'Max depth', hint: 'messages', kind: 'number' },
    max_bytes: { label: 'Max bytes', hint: 'bytes of message bodies', kind: 'number' },
    overflow: { label: 'Overflow', hint: 'when a bound is reached', kind: 'overflow' },
    max_age: { label: 'Max age', hint: 'a duration: 90s, 1h', kind: 'text' },
    max_attempts: { label: 'Max attempts', hint: 'deliveries before dead-lettering', kind: 'number' },
    dead_letter_topic: { label: 'Dead-letter topic', hint: 'a topic name', kind: 'text' },
    max_rate: { label: 'Max rate', hint: 'messages a second', kind: 'number' },
};

/** The value a setting shows: "–" for unset, numbers with Go's commas. */
function show(key, value) {
    if (value === null || value === undefined) return '–';
    if (typeof value === 'number' && key !== 'max_rate') return commafy(value);
    return String(value);
}

/** What an input's text sends: "" unsets (null), a number is a number, the rest as typed. */
function parse(kind, text) {
    const t = text.trim();
    if (t === '') return null;
    if (kind === 'number' && /^-?\d+(\.\d+)?$/.test(t)) return Number(t);
    return t;
}

/** The value the dialog starts a key from: the nodes' common one, or "" when they differ. */
function common(nodes, key) {
    const values = nodes.filter((n) => n.config).map((n) => n.config[key]);
    if (!values.length) return { text: '', varies: false };
    const first = values[0];
    const varies = values.some((v) => v !== first);
    if (varies) return { text: '', varies: true };
    return { text: first === null || first === undefined ? '' : String(first), varies: false };
}

/**
 * The settings section: loads `/api/config/topics/<topic>[/<channel>]` and shows a row per
 * nsqd (or its error); admins get an "Edit Settings" button.
 */
export function settingsSection(view, { topic, channel = '' }) {
    const keys = channel ? CHANNEL_KEYS : TOPIC_KEYS;
    const api = `/config/topics/${encodeURIComponent(topic)}${channel ? `/${encodeURIComponent(channel)}` : ''}`;
    const body = h('div', { 'data-settings-body': '' }, h('p', { class: 'muted' }, 'Loading…'));
    const section = h('section', { 'aria-labelledby': 'qs', 'data-section': 'settings' },
        h('h2', { id: 'qs' }, 'Settings'), body);

    const fill = (nodes) => {
        const configured = nodes.some((n) => n.config && keys.some((k) => k !== 'overflow' && n.config[k] !== null));
        const table = h('div', { class: 'table-wrap' }, h('table', { class: 'table', 'data-table': 'settings' },
            h('thead', null, h('tr', null,
                h('th', { scope: 'col' }, 'NSQd Host'),
                keys.map((k) => h('th', { scope: 'col', title: FIELDS[k].hint }, FIELDS[k].label)))),
            h('tbody', null, nodes.map((n) => h('tr', { 'data-node': n.node },
                h('th', { scope: 'row' }, nodeLink(n.node, n.hostname)),
                n.error
                    ? h('td', { colspan: keys.length, class: 'settings-error', 'data-col': 'error' }, n.error)
                    : keys.map((k) => h('td', { 'data-col': k }, show(k, n.config[k]))))))));
        mount(body,
            configured ? null : h('p', { class: 'muted', 'data-settings-none': '' },
                'No limits are set: messages are kept until consumed, as in NSQ.'),
            table,
            config.isAdmin ? h('div', { class: 'actions' },
                h('button', {
                    type: 'button',
                    class: 'btn btn-primary',
                    'data-action': 'settings',
                    onclick: () => editSettings(view, { api, keys, nodes, topic, channel }),
                }, 'Edit Settings')) : null);
    };

    get(api, { signal: view.signal }).then((data) => {
        const nodes = data.nodes || [];
        if (!nodes.length) {
            mount(body, notice('Notice', 'No nsqd has this topic.'));
            return;
        }
        fill(nodes);
    }, (err) => {
        if (err && err.name === 'AbortError') return;
        mount(body, h('div', { class: 'alert alert-error', role: 'alert' }, err.message || String(err)));
    });
    return section;
}

/**
 * The dialog: one field per key, started from the nodes' settings; Save sends the keys whose
 * field changed to every nsqd. All nodes took them: the dialog closes and the page reloads;
 * otherwise it stays open with each node's answer.
 */
export function editSettings(view, { api, keys, nodes, topic, channel }) {
    const target = channel ? `${topic}/${channel}` : topic;
    const inputs = {};
    const start = {};
    const rows = keys.map((k) => {
        const f = FIELDS[k];
        const { text, varies } = common(nodes, k);
        start[k] = text;
        const id = `setting-${k}`;
        let input;
        if (f.kind === 'overflow') {
            input = h('select', { id, name: k },
                varies ? h('option', { value: '' }, '(varies by node)') : null,
                h('option', { value: 'reject', selected: text === 'reject' }, 'reject new messages'),
                h('option', { value: 'drop_oldest', selected: text === 'drop_oldest' }, 'drop the oldest'));
            if (varies) input.value = '';
        } else {
            input = h('input', {
                id,
                name: k,
                type: 'text',
                inputmode: f.kind === 'number' ? 'decimal' : null,
                autocomplete: 'off',
                value: text,
                placeholder: varies ? 'varies by node' : 'unset',
            });
        }
        inputs[k] = input;
        return h('div', { class: 'field' },
            h('label', { for: id }, f.label), input, h('small', { class: 'muted' }, f.hint));
    });
    const status = h('div', { class: 'settings-status', 'aria-live': 'polite' });
    const cancel = h('button', { type: 'button', class: 'btn', value: 'cancel' }, 'Cancel');
    const save = h('button', { type: 'submit', class: 'btn btn-primary', 'data-confirm': '' }, 'Save');
    const form = h('form', { method: 'dialog', class: 'settings-form' },
        h('p', { class: 'muted' }, 'Applied to every nsqd that has the topic. An empty field unsets the setting.'),
        h('div', { class: 'fields' }, rows),
        status,
        h('div', { class: 'dialog-buttons' }, cancel, save));
    const dialog = h('dialog', { class: 'confirm settings', 'aria-labelledby': 'settings-title', 'data-dialog': 'settings' },
        h('h2', { id: 'settings-title' }, `Settings of ${target}`), form);
    const close = () => dialog.close('cancel');
    cancel.addEventListener('click', close);
    dialog.addEventListener('close', () => dialog.remove());
    view.onCleanup(close);

    form.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        const changes = {};
        for (const k of keys) {
            const value = inputs[k].value;
            if (value !== start[k] && !(FIELDS[k].kind === 'overflow' && value === '')) {
                changes[k] = parse(FIELDS[k].kind, value);
            }
        }
        if (!Object.keys(changes).length) {
            close();
            return;
        }
        save.disabled = true;
        mount(status, h('p', { class: 'muted' }, 'Saving…'));
        try {
            const data = await post(api, changes);
            const answers = data.nodes || [];
            const failed = answers.filter((n) => n.error);
            if (!failed.length && answers.length) {
                dialog.close('ok');
                view.flash('success', `Saved the settings of ${target} on ${answers.length} nsqd.`);
                view.reload();
                return;
            }
            mount(status, h('div', { class: 'alert alert-error', role: 'alert', 'data-settings-errors': '' },
                answers.length ? 'Not every nsqd took the settings:' : (data.message || 'No nsqd has this topic.'),
                h('ul', null, answers.map((n) => h('li', { 'data-node': n.node },
                    h('strong', null, n.node), ': ', n.error ? n.error : 'saved')))));
        } catch (err) {
            if (err && err.name === 'AbortError') return;
            mount(status, h('div', { class: 'alert alert-error', role: 'alert', 'data-settings-errors': '' },
                err.message || String(err)));
        } finally {
            save.disabled = false;
        }
    });

    document.body.appendChild(dialog);
    dialog.showModal();
    const first = inputs[keys[0]];
    if (first) first.focus();
    return dialog;
}

/** The counts a queue's settings keep (the "policy" of /api/topics…), as table columns. */
const POLICY_COLUMNS = [
    ['expired_count', 'Expired', 'older than max_age: never delivered'],
    ['dropped_count', 'Dropped', 'dropped by a bound or out of attempts'],
    ['dead_letter_count', 'Dead-Lettered', 'published to the dead-letter topic'],
];

/** The policy columns a table shows: none when no row has settings (Go's nsqd, or unset). */
export function policyColumns(rows, { channel = false } = {}) {
    if (!rows.some((r) => r && r.policy)) return [];
    return channel ? POLICY_COLUMNS : POLICY_COLUMNS.slice(0, 2);
}

export function policyHeads(cols) {
    return cols.map(([, text, title]) => h('th', { scope: 'col', class: 'num', title }, text));
}

export function policyCells(cols, row) {
    const p = (row && row.policy) || null;
    return cols.map(([key]) => h('td', { class: 'num', 'data-col': key }, p ? commafy(p[key] || 0) : ''));
}
