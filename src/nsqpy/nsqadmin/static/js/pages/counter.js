// Counter (/counter): the total of messages processed by every channel on every nsqd
// (/api/counter), counting up as it grows, with the current rate; the published rate of
// the last hour from /api/series; with Graphite, Go's large graph.

import { get } from '../api.js';
import { LineChart } from '../chart.js';
import { config } from '../config.js';
import { h } from '../dom.js';
import { commafy, compact, rate } from '../format.js';
import { graphActive, largeGraphUrl } from '../graphite.js';
import { SeriesFeed } from '../series.js';

const MAX_POLL = 5000;

export async function render(view) {
    view.title('Counter');
    const first = await get('/counter', { signal: view.signal });
    view.warn(first.message);
    const el = view.el;
    const digits = h('div', { class: 'digits', 'aria-hidden': 'true' });
    const spoken = h('span', { class: 'visually-hidden' });
    const number = h('div', { class: 'counter-number', 'data-counter': '' }, digits, spoken);
    const rateLine = h('p', { class: 'counter-rate', 'data-counter-rate': '' }, ' ');
    const panel = h('section', { class: 'counter-panel', 'aria-label': 'Messages processed' },
        number, h('p', { class: 'counter-label' }, 'Messages Processed'), rateLine);
    el.append(h('h1', { class: 'visually-hidden' }, 'Counter'), panel);

    let bigGraph = null;
    if (graphActive()) {
        bigGraph = h('img', { class: 'graphite big-graph', height: 500, alt: 'messages per second graph' });
        el.append(h('div', { class: 'center' }, bigGraph));
    }

    let shown = -1;
    let target = 0;
    let lastTotal = null;
    let lastTime = 0;
    let frame = 0;
    let pollEvery = 1000;

    const write = (n) => {
        const text = commafy(Math.floor(n));
        digits.replaceChildren(...[...text].map((ch) => h('span', { class: ch === ',' ? 'sep' : 'digit' }, ch)));
        spoken.textContent = `${text} messages processed`;
        number.dataset.value = String(Math.floor(n));
    };
    const animate = () => {
        cancelAnimationFrame(frame);
        const from = shown;
        const start = performance.now();
        const duration = Math.min(pollEvery, 1500);
        const step = (now) => {
            const t = Math.min(1, (now - start) / duration);
            shown = from + (target - from) * t;
            write(shown);
            if (t < 1 && !view.closed) frame = requestAnimationFrame(step);
        };
        frame = requestAnimationFrame(step);
    };
    view.onCleanup(() => cancelAnimationFrame(frame));

    const total = (data) => Object.values(data.stats || {}).reduce((n, v) => n + (v.message_count || 0), 0);
    const update = (data) => {
        const now = performance.now();
        const n = total(data);
        if (shown < 0) {
            shown = n;
            target = n;
            write(n);
        } else if (n !== target) {
            target = n;
            animate();
        }
        if (lastTotal !== null && now > lastTime) {
            const r = Math.max(0, ((n - lastTotal) * 1000) / (now - lastTime));
            rateLine.textContent = `${rate(r)} (last ${Math.round((now - lastTime) / 100) / 10}s)`;
        }
        lastTotal = n;
        lastTime = now;
        view.warn(data.message);
        if (bigGraph) {
            bigGraph.src = `${largeGraphUrl('counter', '*', '', '', 'message_count')}&_uniq=${Math.floor(Math.random() * 1e6)}`;
        }
    };
    update(first);

    const poll = async () => {
        try {
            update(await get('/counter', { signal: view.signal }));
            pollEvery = Math.min(MAX_POLL, pollEvery + 1000);
        } catch (err) {
            if (err && err.name === 'AbortError') return;
            view.error(err.message);
            pollEvery = MAX_POLL;
        }
        view.later(poll, pollEvery);
    };
    view.later(poll, pollEvery);

    if (config.series.enabled) {
        const box = h('div', { class: 'chart-box', 'data-chart': 'published' });
        el.append(h('section', { class: 'live', 'aria-label': 'Published messages' }, box));
        let chart = null;
        const feed = new SeriesFeed('/topics', {
            onUpdate: (f) => {
                if (!chart) chart = new LineChart(box, { title: 'Published messages per second (all topics)', format: compact, unit: '/s' });
                const keys = Object.keys(f.data);
                const sum = f.timestamps.map((_, i) => {
                    let s = null;
                    for (const k of keys) {
                        const v = f.data[k].message_rate[i];
                        if (v !== null && v !== undefined) s = (s || 0) + v;
                    }
                    return s;
                });
                chart.update(f.timestamps, [{ name: 'published', values: sum, color: '#16a34a' }]);
            },
        });
        view.later(() => feed.start(), 0);
        view.onCleanup(() => {
            feed.stop();
            if (chart) chart.destroy();
        });
    }
}
