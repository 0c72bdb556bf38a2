// Streams (/): every topic, with its live depth, messages and rate from /api/series
// (Go shows these only through Graphite, which it still does when configured).

import { get } from '../api.js';
import { sparkline } from '../chart.js';
import { config, paths } from '../config.js';
import { h } from '../dom.js';
import { commafy, rate, seconds } from '../format.js';
import { graphActive, rateTarget } from '../graphite.js';
import { SeriesFeed, last } from '../series.js';
import { graphImage, graphiteRateCell, notice } from '../widgets.js';

export async function render(view) {
    view.title('Streams');
    const data = await get('/topics', { signal: view.signal });
    view.warn(data.message);
    const topics = data.topics || [];
    const el = view.el;
    el.append(h('h1', null, 'Topics'));
    if (!topics.length) {
        el.append(notice('Notice', 'No Topics Found'));
        return;
    }
    const live = config.series.enabled;
    const graphs = graphActive();

    const filter = h('input', {
        type: 'search',
        class: 'filter',
        placeholder: 'Filter topics',
        'aria-label': 'Filter topics',
    });
    const count = h('span', { class: 'muted', 'aria-live': 'polite' }, `${topics.length} topics`);
    el.append(h('div', { class: 'toolbar' }, filter, count));

    const head = h('tr', null,
        h('th', { scope: 'col' }, 'Topic'),
        live ? [
            h('th', { scope: 'col', class: 'num', title: 'messages queued at the topic itself' }, 'Depth'),
            h('th', { scope: 'col', class: 'num' }, 'Messages'),
            h('th', { scope: 'col', class: 'num' }, 'Rate'),
            h('th', { scope: 'col' }, `Last ${seconds(config.series.retention)}`),
        ] : null,
        graphs ? [
            h('th', { scope: 'col' }, 'Depth graph'),
            h('th', { scope: 'col' }, 'Messages graph'),
            h('th', { scope: 'col', class: 'num' }, live ? 'Graphite rate' : 'Rate'),
        ] : null);

    const cells = new Map();
    const rows = topics.map((name) => {
        const c = {
            depth: h('td', { class: 'num', 'data-col': 'depth' }, '–'),
            messages: h('td', { class: 'num', 'data-col': 'message_count' }, '–'),
            rate: h('td', { class: 'num rate-live', 'data-col': 'rate' }, '–'),
            spark: h('td', { class: 'spark', 'data-col': 'spark' }),
        };
        cells.set(name, c);
        return h('tr', { 'data-topic': name },
            h('th', { scope: 'row' }, h('a', { href: paths.topic(name) }, name)),
            live ? [c.depth, c.messages, c.rate, c.spark] : null,
            graphs ? [
                h('td', null, graphImage('topic', '', name, '', 'depth')),
                h('td', null, graphImage('topic', '', name, '', 'message_count')),
                graphiteRateCell(rateTarget('topic', '*', name, ''), view.signal),
            ] : null);
    });
    const table = h('table', { class: 'table', 'data-table': 'topics' },
        h('caption', { class: 'visually-hidden' }, 'Topics'),
        h('thead', null, head),
        h('tbody', null, rows));
    el.append(h('div', { class: 'table-wrap' }, table));

    filter.addEventListener('input', () => {
        const q = filter.value.trim().toLowerCase();
        let shown = 0;
        for (const row of rows) {
            const match = !q || row.dataset.topic.toLowerCase().includes(q);
            row.hidden = !match;
            if (match) shown += 1;
        }
        count.textContent = q ? `${shown} of ${topics.length} topics` : `${topics.length} topics`;
    });

    if (!live) return;
    const note = h('p', { class: 'muted series-note' });
    el.append(note);
    const feed = new SeriesFeed('/topics', {
        onUpdate: (f) => {
            note.textContent = f.message;
            for (const [name, c] of cells) {
                const key = `topic:${name}`;
                if (!f.has(key)) continue;
                const depth = last(f.get(key, 'depth'));
                const msgs = last(f.get(key, 'message_count'));
                c.depth.textContent = depth === null ? '–' : commafy(depth);
                c.messages.textContent = msgs === null ? '–' : commafy(msgs);
                const rates = f.get(key, 'message_rate');
                c.rate.textContent = rate(last(rates));
                c.spark.replaceChildren(sparkline(rates, { label: `${name} messages per second`, format: rate }));
            }
        },
        onError: (msg) => {
            note.textContent = `Live rates unavailable: ${msg}`;
        },
    }).start();
    view.onCleanup(() => feed.stop());
}
