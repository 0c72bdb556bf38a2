// Nodes (/nodes): every nsqd: hostname, broadcast address, ports, version, the nsqlookupd
// that know it, and its topics (tombstoned ones marked).

import { get } from '../api.js';
import { config, paths } from '../config.js';
import { h } from '../dom.js';
import { label, notice } from '../widgets.js';

function httpAddress(n) {
    const host = n.broadcast_address.includes(':') ? `[${n.broadcast_address}]` : n.broadcast_address;
    return `${host}:${n.http_port}`;
}

export async function render(view) {
    view.title('Nodes');
    const data = await get('/nodes', { signal: view.signal });
    view.warn(data.message);
    const nodes = data.nodes || [];
    const el = view.el;
    el.append(h('h1', null, `NSQd Nodes (${nodes.length})`));
    if (!nodes.length) {
        el.append(notice('Notice', 'No nsqd nodes found.'));
        return;
    }
    const lookupds = config.nsqlookupd.length;
    el.append(h('div', { class: 'table-wrap' }, h('table', { class: 'table', 'data-table': 'nodes' },
        h('thead', null, h('tr', null,
            h('th', { scope: 'col' }, 'Hostname'),
            h('th', { scope: 'col' }, 'Broadcast Address'),
            h('th', { scope: 'col', class: 'num' }, 'TCP Port'),
            h('th', { scope: 'col', class: 'num' }, 'HTTP Port'),
            h('th', { scope: 'col' }, 'Version'),
            lookupds ? h('th', { scope: 'col' }, 'Lookupd Conns.') : null,
            h('th', { scope: 'col' }, 'Topics'))),
        h('tbody', null, nodes.map((n) => {
            const addr = httpAddress(n);
            const remotes = n.remote_addresses || [];
            let conns = null;
            if (lookupds) {
                const list = h('ul', { class: 'plain conn-list', hidden: true }, remotes.map((r) => h('li', null, r)));
                const button = h('button', {
                    type: 'button',
                    class: ['btn', 'btn-xs', remotes.length !== lookupds ? 'btn-warning' : null],
                    'aria-expanded': 'false',
                    title: `connected to ${remotes.length} of ${lookupds} nsqlookupd`,
                    'data-col': 'lookupd_conns',
                }, String(remotes.length));
                button.addEventListener('click', () => {
                    list.hidden = !list.hidden;
                    button.setAttribute('aria-expanded', String(!list.hidden));
                });
                conns = h('td', null, button, list);
            }
            const topics = n.topics || [];
            return h('tr', {
                class: n.out_of_date ? 'warning' : null,
                title: n.out_of_date ? 'this nsqd runs an older version than the others' : null,
                'data-node': addr,
            },
            h('td', { 'data-col': 'hostname' }, n.hostname),
            h('td', { 'data-col': 'broadcast_address' }, h('a', { href: paths.node(addr) }, n.broadcast_address)),
            h('td', { class: 'num', 'data-col': 'tcp_port' }, String(n.tcp_port)),
            h('td', { class: 'num', 'data-col': 'http_port' }, String(n.http_port)),
            h('td', { 'data-col': 'version' }, n.version, n.out_of_date ? [' ', label('out of date', 'warning')] : null),
            conns,
            h('td', { 'data-col': 'topics' }, topics.length ? [
                h('span', { class: 'badge', title: `${topics.length} topics` }, String(topics.length)), ' ',
                topics.map((t) => [h('a', {
                    href: paths.topic(t.topic),
                    class: ['label', t.tombstoned ? 'label-warning' : 'label-primary'],
                    title: t.tombstoned ? 'this topic is currently tombstoned on this node' : null,
                    'data-topic': t.topic,
                    'data-tombstoned': t.tombstoned ? '' : null,
                }, t.topic), ' ']),
            ] : null));
        })))));
}
