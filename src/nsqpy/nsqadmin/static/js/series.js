// The live time series of /api/series: load the last hour once, then poll with since= and
// append, trimming to the sampler's retention. Used by the rate columns and the charts.

import { get } from './api.js';
import { config } from './config.js';

export const METRICS = [
    'depth', 'memory_depth', 'backend_depth', 'in_flight_count', 'deferred_count', 'client_count',
    'message_count', 'requeue_count', 'timeout_count', 'message_rate', 'requeue_rate', 'timeout_rate',
    // a queue's settings' counts (nsqpy): only in the series of queues that have them
    'expired_count', 'dropped_count', 'dead_letter_count', 'expired_rate', 'dropped_rate', 'dead_letter_rate',
];

/** The series of one answer, keyed: "topic:<name>", "channel:<name>", or "" (the subject). */
function extract(resp) {
    const out = {};
    const n = Array.isArray(resp.timestamps) ? resp.timestamps.length : 0;
    const pick = (obj) => {
        const m = {};
        for (const k of METRICS) m[k] = Array.isArray(obj[k]) ? obj[k] : nulls(n);
        return m;
    };
    if (resp.topics && typeof resp.topics === 'object') {
        for (const [name, sr] of Object.entries(resp.topics)) out[`topic:${name}`] = pick(sr);
    }
    if (Array.isArray(resp.depth)) out[''] = pick(resp);
    if (resp.channels && typeof resp.channels === 'object') {
        for (const [name, sr] of Object.entries(resp.channels)) out[`channel:${name}`] = pick(sr);
    }
    return out;
}

function nulls(n) {
    return new Array(n).fill(null);
}

/** The last non-null value of an array (or null). */
export function last(values) {
    if (!values) return null;
    for (let i = values.length - 1; i >= 0; i--) {
        if (values[i] !== null && values[i] !== undefined) return values[i];
    }
    return null;
}

/**
 * Polls `/api/series<path>` and calls onUpdate(feed) with feed.timestamps and
 * feed.get(key, metric) after every answer; onError(message) when it fails.
 */
export class SeriesFeed {
    constructor(path, { onUpdate, onError } = {}) {
        this.path = path;
        this.onUpdate = onUpdate || (() => {});
        this.onError = onError || (() => {});
        this.timestamps = [];
        this.data = {};
        this.message = '';
        this.retention = config.series.retention || 3600;
        this.interval = Math.max(0.5, config.series.interval || 5);
        this.timer = null;
        this.stopped = false;
        this.controller = new AbortController();
        this.failures = 0;
    }

    get enabled() {
        return config.series.enabled;
    }

    start() {
        if (!this.enabled) return this;
        this.poll();
        return this;
    }

    stop() {
        this.stopped = true;
        clearTimeout(this.timer);
        this.controller.abort();
    }

    /** The values of `metric` for `key` ("" for the page's topic/channel), aligned with timestamps. */
    get(key, metric) {
        const entry = this.data[key];
        return entry ? entry[metric] : nulls(this.timestamps.length);
    }

    has(key) {
        return key in this.data;
    }

    async poll() {
        const lastTs = this.timestamps.length ? this.timestamps[this.timestamps.length - 1] : null;
        const q = lastTs === null ? `window=${this.retention}` : `since=${lastTs}`;
        const sep = this.path.includes('?') ? '&' : '?';
        let delay = this.interval * 1000;
        try {
            const resp = await get(`/series${this.path}${sep}${q}`, { signal: this.controller.signal });
            if (this.stopped) return;
            this.failures = 0;
            this.merge(resp, lastTs !== null);
            this.message = resp.message || '';
            this.onUpdate(this);
        } catch (err) {
            if (this.stopped || (err && err.name === 'AbortError')) return;
            this.failures += 1;
            if (err && err.status === 404) {
                this.onError('the time series are off (--stats-sample-interval=0)');
                return;
            }
            this.onError(err.message || String(err));
            delay = Math.min(30000, delay * 2 ** Math.min(this.failures, 5));
        }
        if (!this.stopped) this.timer = setTimeout(() => this.poll(), delay);
    }

    merge(resp, append) {
        const ts = Array.isArray(resp.timestamps) ? resp.timestamps : [];
        if (resp.retention) this.retention = resp.retention;
        const fresh = extract(resp);
        if (!append) {
            this.timestamps = ts.slice();
            this.data = fresh;
        } else if (ts.length) {
            const before = this.timestamps.length;
            const keys = new Set([...Object.keys(this.data), ...Object.keys(fresh)]);
            for (const key of keys) {
                const old = this.data[key] || {};
                const add = fresh[key] || {};
                const merged = {};
                for (const m of METRICS) {
                    merged[m] = (old[m] || nulls(before)).concat(add[m] && add[m].length ? add[m] : nulls(ts.length));
                }
                this.data[key] = merged;
            }
            this.timestamps = this.timestamps.concat(ts);
        }
        // keep the retention window (and forget series with nothing left in it)
        const n = this.timestamps.length;
        if (!n) return;
        const horizon = this.timestamps[n - 1] - this.retention;
        let cut = 0;
        while (cut < n && this.timestamps[cut] < horizon) cut++;
        if (cut) {
            this.timestamps = this.timestamps.slice(cut);
            for (const key of Object.keys(this.data)) {
                for (const m of METRICS) this.data[key][m] = this.data[key][m].slice(cut);
                if (this.data[key].depth.every((v) => v === null)) delete this.data[key];
            }
        }
    }
}
