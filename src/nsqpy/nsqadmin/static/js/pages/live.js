// The "Last hour" panel of the topic and channel pages: two live charts (messages per
// second, depths) fed by a SeriesFeed, and a hook for the tables' rate cells.

import { LineChart } from '../chart.js';
import { config } from '../config.js';
import { h } from '../dom.js';
import { compact, seconds } from '../format.js';
import { SeriesFeed } from '../series.js';

const rateFmt = (v) => compact(v);

const POLICY_LINES = [
    ['expired_rate', 'expired', '#9333ea'],
    ['dropped_rate', 'dropped', '#64748b'],
    ['dead_letter_rate', 'dead-lettered', '#db2777'],
];

/** The rate lines of a queue's settings' counts (expired, dropped, dead-lettered): only
 * those the series has a sample of (a queue with settings on an nsqpy nsqd). */
export function policyLines(f, key) {
    const out = [];
    for (const [metric, name, color] of POLICY_LINES) {
        const values = f.get(key, metric);
        if (values && values.some((v) => v !== null && v !== undefined)) out.push({ name, values, color });
    }
    return out;
}

/**
 * liveCharts(view, path, {rates: f => [{name, values}], depths: f => [...], onUpdate})
 * → the panel element (null when the time series are off).
 */
export function liveCharts(view, path, { rates, depths, onUpdate }) {
    if (!config.series.enabled) return null;
    const rateBox = h('div', { class: 'chart-box', 'data-chart': 'rate' });
    const depthBox = h('div', { class: 'chart-box', 'data-chart': 'depth' });
    const note = h('p', { class: 'muted series-note' });
    const span = seconds(config.series.retention || 3600);
    const panel = h('section', { class: 'live', 'aria-label': 'Live charts' },
        h('h2', null, 'Last ', span, ' ',
            h('small', { class: 'muted' }, `sampled every ${seconds(config.series.interval)}, refreshing live`)),
        h('div', { class: 'charts' }, rateBox, depthBox),
        note);
    let rateChart = null;
    let depthChart = null;
    const feed = new SeriesFeed(path, {
        onUpdate: (f) => {
            if (!rateChart) {
                rateChart = new LineChart(rateBox, { title: 'Messages per second', format: rateFmt, unit: '/s' });
                depthChart = new LineChart(depthBox, { title: 'Depth', format: compact });
            }
            rateChart.update(f.timestamps, rates(f));
            depthChart.update(f.timestamps, depths(f));
            note.textContent = f.message;
            if (onUpdate) onUpdate(f);
        },
        onError: (msg) => {
            note.textContent = `Live charts unavailable: ${msg}`;
        },
    });
    // charts measure their container: start once the page is in the document
    view.later(() => feed.start(), 0);
    view.onCleanup(() => {
        feed.stop();
        if (rateChart) rateChart.destroy();
        if (depthChart) depthChart.destroy();
    });
    return panel;
}
