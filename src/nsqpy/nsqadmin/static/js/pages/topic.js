// Topic (/topics/:topic): the topic on every nsqd (and the total), its channels, e2e
// latency, live charts, its messages (peek, redrive); actions: empty, delete, pause/unpause,
// tombstone a producer.

import { del, get, post } from '../api.js';
import { sparkline } from '../chart.js';
import { config, encodeNode, paths } from '../config.js';
import { h, mount } from '../dom.js';
import { clock, rate, seconds } from '../format.js';
import { graphActive, rateTarget } from '../graphite.js';
import { last } from '../series.js';
import {
    act, actionButton, breadcrumb, crossButton, e2eCells, e2eCount, e2eHeads, graphRow,
    graphiteRateCell, memDisk, nodeLink, notice, num, pausedLabel, refreshEvery,
} from '../widgets.js';
import { messagesSection } from '../messages.js';
import { policyCells, policyColumns, policyHeads, settingsSection } from '../settings.js';
import { liveCharts, policyLines } from './live.js';

const MAX_LINES = 7;

export async function render(view, { topic }) {
    view.title(topic);
    const api = `/topics/${encodeURIComponent(topic)}`;
    const first = await get(api, { signal: view.signal });
    view.warn(first.message);
    const el = view.el;
    const live = config.series.enabled;
    const graphs = graphActive();

    const top = h('div');
    const nodesSlot = h('div');
    const channelsSlot = h('div');
    el.append(breadcrumb(['Streams', paths.streams()], [topic]), top);

    if (!(first.nodes || []).length) {
        mount(top, h('h1', null, h('span', { class: 'muted' }, 'Topic: '), h('strong', null, topic)));
        el.append(h('h2', null, 'Topic Message Queue'),
            notice('Notice', 'No producers exist for this topic. See ',
                h('a', { href: paths.lookup() }, 'Lookup'), ' for more information.'));
        return;
    }

    // what the live feed updates: the tables' rate and sparkline cells (rebuilt by fill)
    let channels = first.channels || [];
    let liveCells = { total: null, channels: new Map() };
    let feed = null;
    const applyLive = (f) => {
        feed = f;
        if (liveCells.total) liveCells.total.textContent = rate(last(f.get('', 'message_rate')));
        for (const [name, cells] of liveCells.channels) {
            const key = `channel:${name}`;
            const rates = f.get(key, 'message_rate');
            cells.rate.textContent = rate(last(rates));
            cells.spark.replaceChildren(
                sparkline(f.get(key, 'depth'), { label: `${name} depth`, color: '#dc2626' }),
                sparkline(rates, { label: `${name} messages per second`, format: rate }));
        }
    };
    const panel = liveCharts(view, api, {
        rates: (f) => [
            { name: 'published', values: f.get('', 'message_rate') },
            ...channels.slice(0, MAX_LINES).map((c) => ({ name: `→ ${c.channel_name}`, values: f.get(`channel:${c.channel_name}`, 'message_rate') })),
            ...policyLines(f, ''),
        ],
        depths: (f) => [
            { name: 'topic', values: f.get('', 'depth') },
            ...channels.slice(0, MAX_LINES).map((c) => ({ name: c.channel_name, values: f.get(`channel:${c.channel_name}`, 'depth') })),
        ],
        onUpdate: applyLive,
    });
    el.append(nodesSlot);
    if (panel) el.append(panel);
    el.append(channelsSlot, messagesSection(view, { topic, onChange: () => refresh() }), settingsSection(view, { topic }));

    const action = (verb, payload, opts = {}) => () => act(view, {
        verb,
        target: topic,
        danger: opts.danger,
        detail: opts.detail,
        call: () => (payload ? post(api, payload) : del(api)),
        after: opts.after,
        done: opts.done,
    });
    const tombstone = (node) => () => act(view, {
        verb: 'tombstone',
        target: node,
        danger: true,
        detail: `nsqlookupd stops listing ${node} as a producer of ${topic} (until it re-registers).`,
        call: () => del(`/nodes/${encodeNode(node)}`, { topic }),
        done: `Tombstoned ${node} for ${topic}.`,
    });

    const fill = (data) => {
        const nodes = data.nodes || [];
        channels = data.channels || [];
        liveCells = { total: null, channels: new Map() };
        const e2e = data.e2e_processing_latency;
        const nE2e = e2eCount(e2e);
        const showRate = graphs || live;
        const tCols = policyColumns([data, ...nodes]);
        const cCols = policyColumns(channels, { channel: true });
        const tPad = tCols.map(() => null);
        const cPad = cCols.map(() => null);

        // --- title and actions --------------------------------------------------------------
        mount(top,
            h('h1', null, h('span', { class: 'muted' }, 'Topic: '), h('strong', null, topic),
                data.paused ? [' ', pausedLabel()] : null),
            config.isAdmin ? h('div', { class: 'actions', 'data-actions': 'topic' },
                actionButton('Empty Queue', 'warning', action('empty', { action: 'empty' }, {
                    danger: true, detail: 'Every message queued at the topic on every nsqd is dropped.',
                    done: `Emptied topic ${topic}.`,
                }), 'empty'),
                actionButton('Delete Topic', 'danger', action('delete', null, {
                    danger: true, detail: 'The topic, its channels and their messages are deleted on every nsqd and nsqlookupd.',
                    after: paths.streams(), done: `Deleted topic ${topic}.`,
                }), 'delete'),
                data.paused
                    ? actionButton('UnPause Topic', 'success', action('unpause', { action: 'unpause' }, { done: `Unpaused topic ${topic}.` }), 'unpause')
                    : actionButton('Pause Topic', 'primary', action('pause', { action: 'pause' }, { done: `Paused topic ${topic}.` }), 'pause')) : null);

        // --- Topic Message Queue -----------------------------------------------------------
        const rows = [];
        for (const n of nodes) {
            rows.push(h('tr', { 'data-node': n.node },
                h('th', { scope: 'row' },
                    crossButton(`Tombstone ${n.node} for topic ${topic}`, tombstone(n.node), { node: n.node, topic }),
                    ' ', nodeLink(n.node, n.hostname),
                    n.paused ? [' ', pausedLabel()] : null),
                num(n.depth, 'depth'),
                memDisk(n.memory_depth, n.backend_depth),
                num(n.message_count, 'message_count'),
                showRate ? (graphs
                    ? graphiteRateCell(rateTarget('topic', n.node, topic, ''), view.signal)
                    : h('td', { class: 'num muted', 'data-col': 'rate', title: 'per-node rates need Graphite' }, '')) : null,
                num((n.channels || []).length, 'channels'),
                policyCells(tCols, n),
                e2eCells(e2e, n.e2e_processing_latency)));
            const g = graphRow([null, ['topic', n.node, topic, '', 'depth'], null,
                ['topic', n.node, topic, '', 'message_count'], ...(showRate ? [null] : []), null, ...tPad]);
            if (g) rows.push(g);
        }
        let totalRate = null;
        if (showRate) {
            totalRate = graphs
                ? graphiteRateCell(rateTarget('topic', '*', topic, ''), view.signal)
                : h('td', { class: 'num rate-live', 'data-col': 'rate' }, '–');
            if (!graphs) liveCells.total = totalRate;
        }
        rows.push(h('tr', { class: 'total', 'data-node': '*' },
            h('th', { scope: 'row' }, 'Total:'),
            num(data.depth, 'depth'),
            memDisk(data.memory_depth, data.backend_depth),
            num(data.message_count, 'message_count'),
            totalRate,
            num(channels.length, 'channels'),
            policyCells(tCols, data),
            e2eCells(e2e, e2e)));
        const tg = graphRow([null, ['topic', '*', topic, '', 'depth'], null,
            ['topic', '*', topic, '', 'message_count'], ...(showRate ? [null] : []), null, ...tPad]);
        if (tg) rows.push(tg);

        mount(nodesSlot, h('section', { 'aria-labelledby': 'tmq' },
            h('h2', { id: 'tmq' }, 'Topic Message Queue'),
            h('div', { class: 'table-wrap' }, h('table', { class: 'table', 'data-table': 'topic-nodes' },
                h('thead', null,
                    nE2e ? h('tr', null, h('th', { colspan: (showRate ? 6 : 5) + tCols.length }),
                        h('th', { colspan: nE2e, class: 'group' }, 'E2E Processing Latency')) : null,
                    h('tr', null,
                        h('th', { scope: 'col' }, 'NSQd Host'),
                        h('th', { scope: 'col', class: 'num' }, 'Depth'),
                        h('th', { scope: 'col', class: 'num' }, 'Memory + Disk'),
                        h('th', { scope: 'col', class: 'num' }, 'Messages'),
                        showRate ? h('th', { scope: 'col', class: 'num' }, 'Rate') : null,
                        h('th', { scope: 'col', class: 'num' }, 'Channels'),
                        policyHeads(tCols),
                        e2eHeads(e2e))),
                h('tbody', null, rows))),
            live ? h('p', { class: 'muted updated' }, `Tables as of ${clock(Date.now() / 1000, true)}`) : null));

        // --- Channel Message Queues --------------------------------------------------------
        const section = h('section', { 'aria-labelledby': 'cmq' }, h('h2', { id: 'cmq' }, 'Channel Message Queues'));
        mount(channelsSlot, section);
        if (!channels.length) {
            section.append(notice('Notice', 'No channels exist for this topic. ',
                'Messages will queue at the topic until a channel is created.'));
            return;
        }
        const chRows = [];
        for (const c of channels) {
            const cells = {
                rate: h('td', { class: 'num rate-live', 'data-col': 'rate' }, '–'),
                spark: h('td', { class: 'spark', 'data-col': 'spark' }),
            };
            liveCells.channels.set(c.channel_name, cells);
            chRows.push(h('tr', { 'data-channel': c.channel_name },
                h('th', { scope: 'row' },
                    h('a', { href: paths.channel(topic, c.channel_name) }, c.channel_name),
                    c.paused ? [' ', pausedLabel()] : null),
                num(c.depth, 'depth'),
                memDisk(c.memory_depth, c.backend_depth),
                num(c.in_flight_count, 'in_flight_count'),
                num(c.deferred_count, 'deferred_count'),
                num(c.requeue_count, 'requeue_count'),
                num(c.timeout_count, 'timeout_count'),
                num(c.message_count, 'message_count'),
                showRate ? (graphs
                    ? graphiteRateCell(rateTarget('channel', '*', topic, c.channel_name), view.signal)
                    : cells.rate) : null,
                num(c.client_count, 'client_count'),
                policyCells(cCols, c),
                e2eCells(e2e, c.e2e_processing_latency),
                live ? cells.spark : null));
            const g = graphRow([null, ['channel', '', topic, c.channel_name, 'depth'], null,
                ['channel', '', topic, c.channel_name, 'in_flight_count'],
                ['channel', '', topic, c.channel_name, 'deferred_count'],
                ['channel', '', topic, c.channel_name, 'requeue_count'],
                ['channel', '', topic, c.channel_name, 'timeout_count'],
                ['channel', '', topic, c.channel_name, 'message_count'],
                ...(showRate ? [null] : []),
                ['channel', '', topic, c.channel_name, 'clients'], ...cPad]);
            if (g) chRows.push(g);
        }
        section.append(h('div', { class: 'table-wrap' }, h('table', { class: 'table', 'data-table': 'channels' },
            h('thead', null,
                nE2e ? h('tr', null, h('th', { colspan: (showRate ? 10 : 9) + cCols.length }),
                    h('th', { colspan: nE2e, class: 'group' }, 'E2E Processing Latency'),
                    live ? h('th') : null) : null,
                h('tr', null,
                    h('th', { scope: 'col' }, 'Channel'),
                    h('th', { scope: 'col', class: 'num' }, 'Depth'),
                    h('th', { scope: 'col', class: 'num' }, 'Memory + Disk'),
                    h('th', { scope: 'col', class: 'num' }, 'In-Flight'),
                    h('th', { scope: 'col', class: 'num' }, 'Deferred'),
                    h('th', { scope: 'col', class: 'num' }, 'Requeued'),
                    h('th', { scope: 'col', class: 'num' }, 'Timed Out'),
                    h('th', { scope: 'col', class: 'num' }, 'Messages'),
                    showRate ? h('th', { scope: 'col', class: 'num' }, 'Rate') : null,
                    h('th', { scope: 'col', class: 'num' }, 'Connections'),
                    policyHeads(cCols),
                    e2eHeads(e2e),
                    live ? h('th', { scope: 'col' }, `Last ${seconds(config.series.retention)}`) : null)),
            h('tbody', null, chRows))));
    };

    // the tables again (live pages every 10 s; after a message action)
    const refresh = async () => {
        const data = await get(api, { signal: view.signal });
        view.warn(data.message);
        if ((data.nodes || []).length) fill(data);
        if (feed) applyLive(feed);
    };
    fill(first);
    refreshEvery(view, el, refresh);
}
