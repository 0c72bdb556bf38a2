// Our own small SVG charts: a sparkline for table cells and a line chart with axes,
// legend and a hover read-out. Values may be null (no sample): lines break there.

import { h, s } from './dom.js';
import { clock, compact } from './format.js';

export const PALETTE = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#ca8a04', '#db2777'];

function finite(v) {
    return typeof v === 'number' && Number.isFinite(v);
}

/** Path data for `values` at x positions `xs`, broken at nulls. */
function linePath(xs, values, y) {
    let d = '';
    let pen = false;
    for (let i = 0; i < values.length; i++) {
        const v = values[i];
        if (!finite(v)) {
            pen = false;
            continue;
        }
        d += `${pen ? 'L' : 'M'}${xs[i].toFixed(1)} ${y(v).toFixed(1)}`;
        pen = true;
    }
    return d;
}

/** A "nice" upper bound and tick step for [0, max]. */
function niceScale(max, ticks = 4) {
    if (!(max > 0)) return { top: 1, step: 0.25 };
    const raw = max / ticks;
    const mag = 10 ** Math.floor(Math.log10(raw));
    const norm = raw / mag;
    const step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10) * mag;
    return { top: Math.ceil(max / step) * step, step };
}

/**
 * A sparkline (width×height, no axes) of `values`; its accessible name says what it is and
 * the last value. data-points: how many samples it holds.
 */
export function sparkline(values, { width = 96, height = 22, color = PALETTE[0], label = '', format = compact, fill = true } = {}) {
    const vals = values || [];
    const n = vals.length;
    const present = vals.filter(finite);
    const max = present.length ? Math.max(...present) : 0;
    const pad = 2;
    const top = max * 1.15;
    const y = (v) => height - pad - (top > 0 ? (v / top) * (height - 2 * pad) : 0);
    const xs = vals.map((_, i) => (n > 1 ? (i / (n - 1)) * width : width / 2));
    const d = linePath(xs, vals, y);
    const last = present.length ? present[present.length - 1] : null;
    const name = `${label}${label ? ': ' : ''}${last === null ? 'no data yet' : `now ${format(last)}, max ${format(max)}`}`;
    const svg = s('svg', {
        class: 'sparkline',
        width,
        height,
        viewBox: `0 0 ${width} ${height}`,
        role: 'img',
        'aria-label': name,
        'data-points': n,
        'data-max': max,
    });
    svg.appendChild(s('title', null, name));
    if (d) {
        if (fill && present.length > 1) {
            const first = vals.findIndex(finite);
            let lastIdx = vals.length - 1;
            while (lastIdx > 0 && !finite(vals[lastIdx])) lastIdx--;
            svg.appendChild(s('path', {
                d: `${d}L${xs[lastIdx].toFixed(1)} ${height}L${xs[first].toFixed(1)} ${height}Z`,
                fill: color,
                'fill-opacity': '0.08',
                stroke: 'none',
            }));
        }
        svg.appendChild(s('path', { d, fill: 'none', stroke: color, 'stroke-width': '1.5', 'stroke-linejoin': 'round' }));
    } else {
        svg.appendChild(s('line', { x1: 0, x2: width, y1: height - pad, y2: height - pad, class: 'spark-empty' }));
    }
    return svg;
}

/**
 * A time-series line chart in `el`. update(timestamps, series) redraws it; series are
 * [{name, values, color?}]. The chart follows its container's width.
 */
export class LineChart {
    constructor(el, { title, format = compact, height = 170, unit = '' } = {}) {
        this.el = el;
        this.title = title;
        this.format = format;
        this.unit = unit;
        this.height = height;
        this.timestamps = [];
        this.series = [];
        el.classList.add('chart');
        this.heading = h('h3', { class: 'chart-title' }, title);
        this.svgBox = h('div', { class: 'chart-plot' });
        this.tooltip = h('div', { class: 'chart-tooltip', hidden: true });
        this.legend = h('ul', { class: 'chart-legend' });
        el.replaceChildren(this.heading, this.svgBox, this.legend);
        this.svgBox.appendChild(this.tooltip);
        this.observer = new ResizeObserver(() => {
            const w = this.svgBox.clientWidth;
            if (w && w !== this.width) this.draw();
        });
        this.observer.observe(this.svgBox);
    }

    destroy() {
        this.observer.disconnect();
    }

    update(timestamps, series) {
        this.timestamps = timestamps || [];
        this.series = series.map((sr, i) => ({ ...sr, color: sr.color || PALETTE[i % PALETTE.length] }));
        this.draw();
    }

    draw() {
        const width = Math.max(240, this.svgBox.clientWidth || 600);
        this.width = this.svgBox.clientWidth;
        const height = this.height;
        const m = { top: 8, right: 12, bottom: 22, left: 46 };
        const ts = this.timestamps;
        const n = ts.length;
        let max = 0;
        for (const sr of this.series) {
            for (const v of sr.values) if (finite(v) && v > max) max = v;
        }
        const { top, step } = niceScale(max);
        const t0 = n ? ts[0] : 0;
        const t1 = n ? ts[n - 1] : 1;
        const span = t1 - t0 || 1;
        const plotW = width - m.left - m.right;
        const plotH = height - m.top - m.bottom;
        const x = (t) => m.left + (n > 1 ? ((t - t0) / span) * plotW : plotW / 2);
        const y = (v) => m.top + plotH - (v / top) * plotH;
        const xs = ts.map(x);

        const lastValues = this.series.map((sr) => {
            for (let i = sr.values.length - 1; i >= 0; i--) if (finite(sr.values[i])) return sr.values[i];
            return null;
        });
        const label = `${this.title}: ${n ? this.series.map((sr, i) => `${sr.name} ${lastValues[i] === null ? 'no data' : this.format(lastValues[i])}`).join(', ') : 'no samples yet'}`;
        const svg = s('svg', {
            width,
            height,
            viewBox: `0 0 ${width} ${height}`,
            role: 'img',
            'aria-label': label,
            'data-points': n,
            'data-max': max,
        });
        // y grid and labels
        for (let v = 0; v <= top + step / 2; v += step) {
            const yy = y(v);
            svg.appendChild(s('line', { x1: m.left, x2: width - m.right, y1: yy, y2: yy, class: v === 0 ? 'axis' : 'grid' }));
            svg.appendChild(s('text', { x: m.left - 6, y: yy + 4, 'text-anchor': 'end', class: 'tick' }, this.format(v)));
        }
        // x labels
        if (n > 1) {
            const precise = span < 600;
            const count = Math.max(2, Math.min(6, Math.floor(plotW / 90)));
            let prev = '';
            for (let i = 0; i <= count; i++) {
                const t = t0 + (span * i) / count;
                const text = clock(t, precise);
                if (text === prev) continue;
                prev = text;
                svg.appendChild(s('text', {
                    x: x(t),
                    y: height - 6,
                    'text-anchor': i === 0 ? 'start' : i === count ? 'end' : 'middle',
                    class: 'tick',
                }, text));
            }
        } else {
            svg.appendChild(s('text', { x: m.left + plotW / 2, y: m.top + plotH / 2, 'text-anchor': 'middle', class: 'tick' },
                n ? 'one sample so far' : 'waiting for samples…'));
        }
        this.series.forEach((sr) => {
            const d = linePath(xs, sr.values, y);
            svg.appendChild(s('path', {
                d: d || 'M0 0',
                fill: 'none',
                stroke: sr.color,
                'stroke-width': '1.75',
                'stroke-linejoin': 'round',
                'data-series': sr.name,
                'data-count': sr.values.filter(finite).length,
                visibility: d ? 'visible' : 'hidden',
            }));
        });
        const cursor = s('line', { y1: m.top, y2: m.top + plotH, class: 'cursor', visibility: 'hidden' });
        svg.appendChild(cursor);
        const overlay = s('rect', { x: m.left, y: m.top, width: plotW, height: plotH, fill: 'transparent' });
        svg.appendChild(overlay);
        overlay.addEventListener('pointermove', (e) => this.hover(e, svg, xs, cursor));
        overlay.addEventListener('pointerleave', () => {
            cursor.setAttribute('visibility', 'hidden');
            this.tooltip.hidden = true;
        });
        const old = this.svgBox.querySelector('svg');
        if (old) old.replaceWith(svg);
        else this.svgBox.insertBefore(svg, this.tooltip);

        this.legend.replaceChildren(...this.series.map((sr, i) => h('li', null,
            h('span', { class: 'swatch', style: `background:${sr.color}` }),
            h('span', { class: 'legend-name' }, sr.name),
            ' ',
            h('span', { class: 'legend-value', 'data-series': sr.name },
                lastValues[i] === null ? '–' : `${this.format(lastValues[i])}${this.unit}`))));
    }

    hover(e, svg, xs, cursor) {
        if (!xs.length) return;
        const rect = svg.getBoundingClientRect();
        const px = e.clientX - rect.left;
        let lo = 0;
        let hi = xs.length - 1;
        while (hi - lo > 1) {
            const mid = (lo + hi) >> 1;
            if (xs[mid] < px) lo = mid;
            else hi = mid;
        }
        const i = Math.abs(xs[lo] - px) <= Math.abs(xs[hi] - px) ? lo : hi;
        cursor.setAttribute('x1', xs[i]);
        cursor.setAttribute('x2', xs[i]);
        cursor.setAttribute('visibility', 'visible');
        this.tooltip.replaceChildren(
            h('div', { class: 'tooltip-time' }, clock(this.timestamps[i], true)),
            ...this.series.map((sr) => h('div', null,
                h('span', { class: 'swatch', style: `background:${sr.color}` }),
                `${sr.name}: ${finite(sr.values[i]) ? this.format(sr.values[i]) + this.unit : '–'}`)));
        this.tooltip.hidden = false;
        const left = Math.min(xs[i] + 10, rect.width - this.tooltip.offsetWidth - 4);
        this.tooltip.style.left = `${Math.max(0, left)}px`;
    }
}
