// Channel (/topics/:topic/:channel): the channel on every nsqd (and the total), its
// clients, e2e latency, live charts, its messages (peek, requeue, remove); actions: empty,
// delete, pause/unpause.

import { del, get, post } from '../api.js';
import { config, paths } from '../config.js';
import { h, mount } from '../dom.js';
import { clock, nanotohuman, rate } from '../format.js';
import { graphActive, rateTarget } from '../graphite.js';
import { last } from '../series.js';
import {
    act, actionButton, breadcrumb, e2eCells, e2eCount, e2eHeads, graphRow, graphiteRateCell,
    label, memDisk, nodeLink, notice, num, pausedLabel, refreshEvery,
} from '../widgets.js';
import { messagesSection } from '../messages.js';
import { policyCells, policyColumns, policyHeads, settingsSection } from '../settings.js';
import { liveCharts, policyLines } from './live.js';

/** Go's client host: hostname plus the remote port, and the client_id when it says more. */
export function clientHost(c) {
    const remote = c.remote_address || '';
    const hostname = c.hostname || remote.slice(0, remote.lastIndexOf(':'));
    const short = hostname.split('.')[0];
    const id = c.client_id || '';
    const showId = id !== '' && id.toLowerCase() !== short.toLowerCase() && id.toLowerCase() !== hostname.toLowerCase();
    const port = remote.split(':').pop();
    return `${hostname}:${port}${showId ? ` (${id})` : ''}`;
}

export function clientAttributes(c) {
    const out = [];
    if (c.sample_rate) out.push(label(`Sampled ${c.sample_rate}%`, 'info'));
    if (c.tls) {
        const title = c.tls_version
            ? `${c.tls_version} ${c.tls_cipher_suite} ${c.tls_negotiated_protocol} mutual:${c.tls_negotiated_protocol_is_mutual}`
            : null;
        out.push(label('TLS', 'warning', title));
    }
    if (c.deflate) out.push(label('Deflate', 'default'));
    if (c.snappy) out.push(label('Snappy', 'primary'));
    if (c.authed) {
        const title = `Authed${c.auth_identity ? ` Identity: ${c.auth_identity}` : ''}`;
        const text = c.auth_identity ? `Auth: ${c.auth_identity}` : 'Authed';
        out.push(c.auth_identity_url
            ? h('a', { href: c.auth_identity_url, class: 'label label-success', title, 'data-external': '', rel: 'noopener' }, text)
            : label(text, 'success', title));
    }
    return out.flatMap((x, i) => (i ? [' ', x] : [x]));
}

export async function render(view, { topic, channel }) {
    view.title(`${topic} / ${channel}`);
    const api = `/topics/${encodeURIComponent(topic)}/${encodeURIComponent(channel)}`;
    const first = await get(api, { signal: view.signal });
    view.warn(first.message);
    const el = view.el;
    const live = config.series.enabled;
    const graphs = graphActive();
    const target = `${topic}/${channel}`;

    const top = h('div');
    const nodesSlot = h('div');
    const clientsSlot = h('div');
    el.append(breadcrumb(['Streams', paths.streams()], [topic, paths.topic(topic)], [channel]), top, nodesSlot);

    let totalRate = null;
    let feed = null;
    const applyLive = (f) => {
        feed = f;
        if (totalRate) totalRate.textContent = rate(last(f.get('', 'message_rate')));
    };
    const hasNodes = (first.nodes || []).length > 0;
    if (hasNodes) {
        const panel = liveCharts(view, api, {
            rates: (f) => [
                { name: 'messages', values: f.get('', 'message_rate') },
                { name: 'requeued', values: f.get('', 'requeue_rate') },
                { name: 'timed out', values: f.get('', 'timeout_rate') },
                ...policyLines(f, ''),
            ],
            depths: (f) => [
                { name: 'depth', values: f.get('', 'depth'), color: '#dc2626' },
                { name: 'in-flight', values: f.get('', 'in_flight_count'), color: '#2563eb' },
                { name: 'deferred', values: f.get('', 'deferred_count'), color: '#ca8a04' },
            ],
            onUpdate: applyLive,
        });
        if (panel) el.append(panel);
    }
    el.append(clientsSlot, messagesSection(view, { topic, channel, onChange: () => refresh() }), settingsSection(view, { topic, channel }));

    const action = (verb, payload, opts = {}) => () => act(view, {
        verb,
        target,
        danger: opts.danger,
        detail: opts.detail,
        call: () => (payload ? post(api, payload) : del(api)),
        after: opts.after,
        done: opts.done,
    });

    const fill = (data) => {
        const nodes = data.nodes || [];
        const clients = data.clients || [];
        mount(top, h('h1', null,
            h('span', { class: 'muted' }, 'Topic: '), h('a', { href: paths.topic(topic) }, topic),
            h('span', { class: 'muted' }, ' · Channel: '), h('strong', null, channel),
            data.paused ? [' ', pausedLabel()] : null));

        if (!nodes.length) {
            mount(nodesSlot, notice('Notice', 'No producers exist for this topic/channel. See ',
                h('a', { href: paths.lookup() }, 'Lookup'), ' for more information.'));
        } else {
            if (config.isAdmin) {
                top.append(h('div', { class: 'actions', 'data-actions': 'channel' },
                    actionButton('Empty Queue', 'warning', action('empty', { action: 'empty' }, {
                        danger: true, detail: 'Every message queued in this channel on every nsqd is dropped.',
                        done: `Emptied channel ${target}.`,
                    }), 'empty'),
                    actionButton('Delete Channel', 'danger', action('delete', null, {
                        danger: true, detail: 'The channel and its messages are deleted on every nsqd and nsqlookupd.',
                        after: paths.topic(topic), done: `Deleted channel ${target}.`,
                    }), 'delete'),
                    data.paused
                        ? actionButton('UnPause Channel', 'success', action('unpause', { action: 'unpause' }, { done: `Unpaused channel ${target}.` }), 'unpause')
                        : actionButton('Pause Channel', 'primary', action('pause', { action: 'pause' }, { done: `Paused channel ${target}.` }), 'pause')));
            }

            const e2e = data.e2e_processing_latency;
            const nE2e = e2eCount(e2e);
            const showRate = graphs || live;
            const pCols = policyColumns([data, ...nodes], { channel: true });
            totalRate = null;
            const rows = [];
            const graphCells = (node) => [null, ['channel', node, topic, channel, 'depth'], null,
                ['channel', node, topic, channel, 'in_flight_count'],
                ['channel', node, topic, channel, 'deferred_count'],
                ['channel', node, topic, channel, 'requeue_count'],
                ['channel', node, topic, channel, 'timeout_count'],
                ['channel', node, topic, channel, 'message_count'],
                ...(showRate ? [null] : []),
                ['channel', node, topic, channel, 'clients'], ...pCols.map(() => null)];
            const row = (n, total) => h('tr', { class: total ? 'total' : null, 'data-node': total ? '*' : n.node },
                h('th', { scope: 'row' }, total ? 'Total:' : [nodeLink(n.node, n.hostname), n.paused ? [' ', pausedLabel()] : null]),
                num(n.depth, 'depth'),
                memDisk(n.memory_depth, n.backend_depth),
                num(n.in_flight_count, 'in_flight_count'),
                num(n.deferred_count, 'deferred_count'),
                num(n.requeue_count, 'requeue_count'),
                num(n.timeout_count, 'timeout_count'),
                num(n.message_count, 'message_count'),
                showRate ? (graphs
                    ? graphiteRateCell(rateTarget('channel', total ? '*' : n.node, topic, channel), view.signal)
                    : (total
                        ? (totalRate = h('td', { class: 'num rate-live', 'data-col': 'rate' }, '–'))
                        : h('td', { class: 'num muted', 'data-col': 'rate', title: 'per-node rates need Graphite' }, ''))) : null,
                num(n.client_count, 'client_count'),
                policyCells(pCols, n),
                e2eCells(e2e, n.e2e_processing_latency));
            for (const n of nodes) {
                rows.push(row(n, false));
                const g = graphRow(graphCells(n.node));
                if (g) rows.push(g);
            }
            rows.push(row(data, true));
            const g = graphRow(graphCells('*'));
            if (g) rows.push(g);

            mount(nodesSlot, h('section', { 'aria-labelledby': 'ch' },
                h('h2', { id: 'ch' }, 'Channel'),
                h('div', { class: 'table-wrap' }, h('table', { class: 'table', 'data-table': 'channel-nodes' },
                    h('thead', null,
                        h('tr', null,
                            h('th'),
                            h('th', { colspan: 4, class: 'group' }, 'Message Queues'),
                            h('th', { colspan: (showRate ? 5 : 4) + pCols.length, class: 'group' }, 'Statistics'),
                            nE2e ? h('th', { colspan: nE2e, class: 'group' }, 'E2E Processing Latency') : null),
                        h('tr', null,
                            h('th', { scope: 'col' }, 'NSQd Host'),
                            h('th', { scope: 'col', class: 'num' }, 'Depth'),
                            h('th', { scope: 'col', class: 'num' }, 'Memory + Disk'),
                            h('th', { scope: 'col', class: 'num' }, 'In-Flight'),
                            h('th', { scope: 'col', class: 'num' }, 'Deferred'),
                            h('th', { scope: 'col', class: 'num' }, 'Requeued'),
                            h('th', { scope: 'col', class: 'num' }, 'Timed Out'),
                            h('th', { scope: 'col', class: 'num' }, 'Messages'),
                            showRate ? h('th', { scope: 'col', class: 'num' }, 'Rate') : null,
                            h('th', { scope: 'col', class: 'num' }, 'Connections'),
                            policyHeads(pCols),
                            e2eHeads(e2e))),
                    h('tbody', null, rows))),
                live ? h('p', { class: 'muted updated' }, `Tables as of ${clock(Date.now() / 1000, true)}`) : null));
        }

        // --- Client Connections --------------------------------------------------------------
        const section = h('section', { 'aria-labelledby': 'cc' }, h('h2', { id: 'cc' }, 'Client Connections'));
        mount(clientsSlot, section);
        if (!clients.length) {
            section.append(notice('Notice', 'No clients connected to this channel'));
            return;
        }
        section.append(h('div', { class: 'table-wrap' }, h('table', { class: 'table', 'data-table': 'clients' },
            h('thead', null, h('tr', null,
                h('th', { scope: 'col' }, 'Client Host'),
                h('th', { scope: 'col' }, 'User-Agent'),
                h('th', { scope: 'col' }, 'Attributes'),
                h('th', { scope: 'col' }, 'NSQd Host'),
                h('th', { scope: 'col', class: 'num' }, 'In-Flight'),
                h('th', { scope: 'col', class: 'num' }, 'Ready Count'),
                h('th', { scope: 'col', class: 'num' }, 'Finished'),
                h('th', { scope: 'col', class: 'num' }, 'Requeued'),
                h('th', { scope: 'col', class: 'num' }, 'Messages'),
                h('th', { scope: 'col', class: 'num' }, 'Connected'))),
            h('tbody', null, clients.map((c) => h('tr', { 'data-client': c.remote_address, 'data-node': c.node },
                h('td', { title: c.remote_address, 'data-col': 'host' }, clientHost(c)),
                h('td', { 'data-col': 'user_agent' }, c.user_agent ? h('small', null, c.user_agent) : null),
                h('td', { 'data-col': 'attributes' }, clientAttributes(c)),
                h('td', { 'data-col': 'node' }, h('a', { href: paths.node(c.node) }, c.node)),
                num(c.in_flight_count, 'in_flight_count'),
                num(c.ready_count, 'ready_count'),
                num(c.finish_count, 'finish_count'),
                num(c.requeue_count, 'requeue_count'),
                num(c.message_count, 'message_count'),
                h('td', { class: 'num', 'data-col': 'connected', title: c.connect_ts ? new Date(c.connect_ts * 1000).toISOString() : null },
                    nanotohuman(c.connected))))))));
    };

    // the tables again (live pages every 10 s; after a message action)
    const refresh = async () => {
        const data = await get(api, { signal: view.signal });
        view.warn(data.message);
        if ((data.nodes || []).length) fill(data);
        if (feed) applyLive(feed);
    };
    fill(first);
    if (!hasNodes) return;
    refreshEvery(view, el, refresh);
}
