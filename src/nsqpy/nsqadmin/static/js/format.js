// Number and duration formatting, as Go's nsqadmin prints them (commafy, nanotohuman,
// percentiles) plus the compact forms of rates and chart axes (1.2k, 3.4M).

/** 1234567 → "1,234,567" (integers as nsqd reports them). */
export function commafy(n) {
    const s = String(n || 0);
    const [int, frac] = s.split('.');
    const grouped = int.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
    return frac === undefined ? grouped : `${grouped}.${frac}`;
}

function round(n, places) {
    const m = 10 ** places;
    return Math.round(n * m) / m;
}

/** Nanoseconds as a short duration: "1h2m3.5s", "12.5ms", "830us", "0ns". */
export function nanotohuman(n) {
    n = Number(n) || 0;
    let s = '';
    if (n >= 3600e9) {
        s += `${Math.floor(n / 3600e9)}h`;
        n %= 3600e9;
    }
    if (n >= 60e9) {
        s += `${Math.floor(n / 60e9)}m`;
        n %= 60e9;
    }
    if (n >= 1e9) s += `${round(n / 1e9, 2)}s`;
    else if (s !== '') return s; // whole hours or minutes
    else if (n >= 1e6) s = `${round(n / 1e6, 2)}ms`;
    else if (n >= 1e3) s = `${round(n / 1e3, 2)}us`;
    else s = `${Math.round(n)}ns`;
    return s;
}

/** 0.99 → 99 (Go's floatToPercent). */
export function floatToPercent(f) {
    return Math.floor(f * 100);
}

/** The ordinal suffix of a percentile: 1 → "st", 2 → "nd", 99 → "th", 11 → "th". */
export function percSuffix(f) {
    const v = Math.floor(f * 100);
    if (v % 100 >= 11 && v % 100 <= 13) return 'th';
    return { 1: 'st', 2: 'nd', 3: 'rd' }[v % 10] || 'th';
}

const UNITS = [
    [1e12, 'T'],
    [1e9, 'G'],
    [1e6, 'M'],
    [1e3, 'k'],
];

/** A short number for rates and axes: 0.25, 12, 950, 1.2k, 34k, 5.6M. */
export function compact(n) {
    if (n === null || n === undefined || Number.isNaN(n)) return '–';
    const abs = Math.abs(n);
    for (const [size, unit] of UNITS) {
        if (abs >= size) {
            const v = n / size;
            return `${Math.abs(v) >= 100 ? Math.round(v) : round(v, 1)}${unit}`;
        }
    }
    if (abs === 0) return '0';
    if (abs < 10) return String(round(n, 2));
    if (abs < 100) return String(round(n, 1));
    return String(Math.round(n));
}

/** A rate in messages per second: "1.2k/s", "0/s", "–" when unknown. */
export function rate(n) {
    if (n === null || n === undefined || Number.isNaN(n)) return '–';
    return `${compact(n)}/s`;
}

/** Seconds as a compact duration for labels: "5s", "1m", "1h", "1h30m". */
export function seconds(s) {
    if (s > 0 && s < 10 && !Number.isInteger(s)) return `${round(s, 2)}s`;
    s = Math.round(s);
    if (s < 60) return `${s}s`;
    if (s < 3600) return s % 60 ? `${Math.floor(s / 60)}m${s % 60}s` : `${s / 60}m`;
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    return m ? `${h}h${m}m` : `${h}h`;
}

/** A clock time for chart axes (HH:MM, or HH:MM:SS when `precise`). */
export function clock(ts, precise) {
    const d = new Date(ts * 1000);
    const pad = (v) => String(v).padStart(2, '0');
    const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
    return precise ? `${hm}:${pad(d.getSeconds())}` : hm;
}
