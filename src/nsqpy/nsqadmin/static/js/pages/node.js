// Node (/nodes/:node): one nsqd's topics, channels (paused labels) and clients; with
// Graphite, its memory and GC graphs; action: tombstone a topic on this node.

import { del, get } from '../api.js';
import { encodeNode, paths } from '../config.js';
import { h } from '../dom.js';
import { commafy, nanotohuman } from '../format.js';
import { graphActive, largeGraphUrl } from '../graphite.js';
import { act, breadcrumb, crossButton, memDisk, notice, num, pausedLabel } from '../widgets.js';
import { clientAttributes, clientHost } from './channel.js';

const GRAPHS = [
    ['*_bytes', 'GC Pressure'],
    ['gc_pause_*', 'GC Pause Percentiles'],
    ['gc_runs', 'GC Runs'],
    ['heap_objects', 'Heap Objects In-Use'],
];

function clientsTable(clients) {
    return h('table', { class: 'table table-inner', 'data-table': 'clients' },
        h('thead', null, h('tr', null,
            h('th', { scope: 'col' }, 'Client Host'),
            h('th', { scope: 'col' }, 'User-Agent'),
            h('th', { scope: 'col' }, 'Attributes'),
            h('th', { scope: 'col', class: 'num' }, 'In-Flight'),
            h('th', { scope: 'col', class: 'num' }, 'Ready Count'),
            h('th', { scope: 'col', class: 'num' }, 'Requeued'),
            h('th', { scope: 'col', class: 'num' }, 'Finished'),
            h('th', { scope: 'col', class: 'num' }, 'Messages'),
            h('th', { scope: 'col', class: 'num' }, 'Connected'))),
        h('tbody', null, clients.map((c) => h('tr', { 'data-client': c.remote_address },
            h('td', { title: c.remote_address, 'data-col': 'host' }, clientHost(c)),
            h('td', { 'data-col': 'user_agent' }, c.user_agent ? h('small', null, c.user_agent) : null),
            h('td', { 'data-col': 'attributes' }, clientAttributes(c)),
            num(c.in_flight_count, 'in_flight_count'),
            num(c.ready_count, 'ready_count'),
            num(c.requeue_count, 'requeue_count'),
            num(c.finish_count, 'finish_count'),
            num(c.message_count, 'message_count'),
            h('td', { class: 'num', 'data-col': 'connected' }, nanotohuman(c.connected))))));
}

export async function render(view, { node }) {
    view.title(node);
    const data = await get(`/nodes/${encodeNode(node)}`, { signal: view.signal });
    view.warn(data.message);
    const topics = data.topics || [];
    const el = view.el;
    el.append(
        breadcrumb(['Nodes', paths.nodes()], [node]),
        h('h1', null, h('span', { class: 'muted' }, 'Node: '), h('strong', null, node)));

    if (graphActive()) {
        el.append(h('div', { class: 'graph-grid' }, GRAPHS.map(([key, title]) => {
            const url = largeGraphUrl('node', node, '', '', key);
            return h('figure', null,
                h('a', { href: url, 'data-external': '' }, h('img', { class: 'graphite', width: 200, src: url, alt: `${title} graph` })),
                h('figcaption', null, title));
        })));
    }

    el.append(h('dl', { class: 'stats-summary' },
        h('div', null, h('dt', null, 'Topics'), h('dd', { 'data-stat': 'topics' }, commafy(topics.length))),
        h('div', null, h('dt', null, 'Messages'), h('dd', { 'data-stat': 'messages' }, commafy(data.total_messages))),
        h('div', null, h('dt', null, 'Clients'), h('dd', { 'data-stat': 'clients' }, commafy(data.total_clients)))));

    if (!topics.length) {
        el.append(notice('Notice', 'No topics exist on this node.'));
        return;
    }

    for (const t of topics) {
        const channels = t.channels || [];
        const tombstone = () => act(view, {
            verb: 'tombstone',
            target: node,
            danger: true,
            detail: `nsqlookupd stops listing ${node} as a producer of ${t.topic_name} (until it re-registers).`,
            call: () => del(`/nodes/${encodeNode(node)}`, { topic: t.topic_name }),
            done: `Tombstoned ${node} for ${t.topic_name}.`,
        });
        const chRows = [];
        for (const c of channels) {
            const clients = c.clients || [];
            chRows.push(h('tr', { 'data-channel': c.channel_name },
                h('th', { scope: 'row' }, h('a', { href: paths.channel(t.topic_name, c.channel_name) }, c.channel_name),
                    c.paused ? [' ', pausedLabel()] : null),
                num(c.depth, 'depth'),
                memDisk(c.memory_depth, c.backend_depth),
                num(c.in_flight_count, 'in_flight_count'),
                num(c.deferred_count, 'deferred_count'),
                num(c.requeue_count, 'requeue_count'),
                num(c.timeout_count, 'timeout_count'),
                num(c.message_count, 'message_count'),
                num(clients.length, 'client_count')));
            chRows.push(h('tr', { class: 'sub-row', 'data-clients-of': c.channel_name },
                h('td', { colspan: 9 }, clients.length
                    ? clientsTable(clients)
                    : h('span', { class: 'muted' }, 'No clients connected to this channel.'))));
        }
        el.append(h('section', { class: 'node-topic', 'data-topic': t.topic_name },
            h('h2', null,
                crossButton(`Tombstone topic ${t.topic_name} on ${node}`, tombstone, { node, topic: t.topic_name }),
                ' ', h('a', { href: paths.topic(t.topic_name) }, t.topic_name),
                t.paused ? [' ', pausedLabel()] : null),
            h('dl', { class: 'stats-summary compact', 'data-topic-row': t.topic_name },
                h('div', null, h('dt', null, 'Depth'), h('dd', { 'data-col': 'depth' }, commafy(t.depth))),
                h('div', null, h('dt', null, 'Memory + Disk'),
                    h('dd', { 'data-col': 'memory_disk' }, `${commafy(t.memory_depth)} + ${commafy(t.backend_depth)}`)),
                h('div', null, h('dt', null, 'Messages'), h('dd', { 'data-col': 'message_count' }, commafy(t.message_count))),
                h('div', null, h('dt', null, 'Channels'), h('dd', { 'data-col': 'channels' }, commafy(channels.length)))),
            channels.length
                ? h('div', { class: 'table-wrap' }, h('table', { class: 'table', 'data-table': 'node-channels' },
                    h('thead', null, h('tr', null,
                        h('th', { scope: 'col' }, 'Channel'),
                        h('th', { scope: 'col', class: 'num' }, 'Depth'),
                        h('th', { scope: 'col', class: 'num' }, 'Memory + Disk'),
                        h('th', { scope: 'col', class: 'num' }, 'In-Flight'),
                        h('th', { scope: 'col', class: 'num' }, 'Deferred'),
                        h('th', { scope: 'col', class: 'num' }, 'Requeued'),
                        h('th', { scope: 'col', class: 'num' }, 'Timed Out'),
                        h('th', { scope: 'col', class: 'num' }, 'Messages'),
                        h('th', { scope: 'col', class: 'num' }, 'Connections'))),
                    h('tbody', null, chRows)))
                : notice('Notice', 'No channels exist for this topic.')));
    }
}
