// Go's Graphite behaviour (with --graphite-url): the graph timeframe, sparkline and large
// graph images from /render, and the rate column from /api/graphite. Targets follow the
// statsd names nsqd sends (--statsd-prefix, --statsd-counter-format, --statsd-gauge-format).

import { get } from './api.js';
import { config } from './config.js';

export const GRAPH_INTERVALS = ['1h', '2h', '12h', '24h', '48h', '168h', 'off'];
const STORAGE_KEY = 'graph_interval';

function initialInterval() {
    const fromQuery = new URLSearchParams(window.location.search).get('t');
    let stored = null;
    try {
        stored = window.localStorage.getItem(STORAGE_KEY);
    } catch {
        stored = null;
    }
    const v = fromQuery || stored || (config.graphEnabled ? '2h' : 'off');
    return GRAPH_INTERVALS.includes(v) ? v : '2h';
}

let interval = initialInterval();

export function graphInterval() {
    return interval;
}

export function setGraphInterval(v) {
    interval = v;
    try {
        window.localStorage.setItem(STORAGE_KEY, v);
    } catch {
        // private mode: keep it for this page only
    }
}

/** Graphs are drawn when Graphite is configured and the timeframe is not "off". */
export function graphActive() {
    return config.graphEnabled && interval !== 'off';
}

const METRIC_TYPES = {
    depth: 'gauge',
    in_flight_count: 'gauge',
    deferred_count: 'gauge',
    requeue_count: 'counter',
    timeout_count: 'counter',
    message_count: 'counter',
    clients: 'gauge',
    '*_bytes': 'gauge',
    'gc_pause_*': 'gauge',
    gc_runs: 'counter',
    heap_objects: 'gauge',
    e2e_processing_latency: 'gauge',
};

function statsdKey(type, key) {
    const fmt = type === 'counter' ? config.statsdCounterFormat
        : type === 'gauge' ? config.statsdGaugeFormat : '';
    return fmt ? fmt.replace(/%s/g, key) : key;
}

function statsdPrefix(host) {
    let prefix = config.statsdPrefix.replace(/%s/g, host.replace(/[.:]/g, '_'));
    if (prefix && !prefix.endsWith('.')) prefix += '.';
    return prefix;
}

function colors(typ, key) {
    if ((typ === 'topic' || typ === 'channel') && (key === 'depth' || key === 'deferred_count')) return 'red';
    if (typ === 'node') return 'red,green,blue,purple';
    if (typ === 'counter') return 'green';
    return 'blue';
}

/**
 * Graphite targets: typ is topic, channel, node, e2e or counter; node is a host:port, "*"
 * for every node; ns1/ns2 the topic and channel (for e2e, ns1 is the latency aggregate).
 */
export function targets(typ, node, ns1, ns2, key) {
    const prefix = statsdPrefix(node || '*');
    const type = METRIC_TYPES[key];
    if (typ === 'topic') return [`sumSeries(${statsdKey(type, `${prefix}topic.${ns1}.${key}`)})`];
    if (typ === 'channel') {
        return [`sumSeries(${statsdKey(type, `${prefix}topic.${ns1}.channel.${ns2}.${key}`)})`];
    }
    if (typ === 'node') {
        let t = statsdKey(type, `${prefix}mem.${key}`);
        if (key === 'gc_runs') t = `movingAverage(${t},45)`;
        return [t];
    }
    if (typ === 'e2e') {
        return ((ns1 && ns1.percentiles) || []).map((p) => {
            const q = Math.round(p.quantile * 100);
            let t = ns1.channel
                ? `${prefix}topic.${ns1.topic}.channel.${ns1.channel}.${key}_${q}`
                : `${prefix}topic.${ns1.topic}.${key}_${q}`;
            t = statsdKey(type, t);
            if (node === '*') t = `averageSeries(${t})`;
            return `scale(${t},0.000001)`;
        });
    }
    if (typ === 'counter') return [`sumSeries(${statsdKey(type, `${prefix}topic.*.channel.*.${key}`)})`];
    return [];
}

function renderUrl(params, list) {
    const q = new URLSearchParams(params);
    for (const t of list) q.append('target', t);
    return `${config.graphiteUrl}/render?${q.toString()}`;
}

/** A 120×20 sparkline image from Graphite. */
export function sparklineUrl(typ, node, ns1, ns2, key) {
    const every = `${config.statsdInterval}sec`;
    return renderUrl({
        colorList: colors(typ, key),
        height: '20',
        width: '120',
        hideGrid: 'true',
        hideLegend: 'true',
        hideAxes: 'true',
        bgcolor: 'ff000000',
        fgcolor: 'black',
        margin: '0',
        yMin: '0',
        lineMode: 'connected',
        drawNullAsZero: 'false',
        from: `-${interval}`,
        until: '-1min',
    }, targets(typ, node, ns1, ns2, key).map((t) => `summarize(${t},"${every}","avg")`));
}

/** An 800×450 graph from Graphite (counters scaled to per second). */
export function largeGraphUrl(typ, node, ns1, ns2, key) {
    const every = `${config.statsdInterval}sec`;
    return renderUrl({
        colorList: colors(typ, key),
        height: '450',
        width: '800',
        bgcolor: 'ff000000',
        fgcolor: '999999',
        yMin: '0',
        lineMode: 'connected',
        drawNullAsZero: 'false',
        from: `-${interval}`,
        until: '-1min',
    }, targets(typ, node, ns1, ns2, key).map((t) => {
        const scaled = METRIC_TYPES[key] === 'counter' ? `scale(${t},${1 / config.statsdInterval})` : t;
        return `summarize(${scaled},"${every}","avg")`;
    }));
}

/** The rate target of a topic or channel (message_count). */
export function rateTarget(typ, node, ns1, ns2) {
    return targets(typ, node, ns1, ns2, 'message_count')[0];
}

/** The Graphite rate of `target` as /api/graphite words it ("12.34", "N/A"); "ERROR" on failure. */
export async function fetchRate(target, signal) {
    try {
        const data = await get(`/graphite?metric=rate&target=${encodeURIComponent(target)}`, { signal });
        return String(data.rate);
    } catch (err) {
        if (err && err.name === 'AbortError') throw err;
        return 'ERROR';
    }
}
