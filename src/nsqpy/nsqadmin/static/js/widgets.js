// Pieces the pages share: alerts and notices, breadcrumbs, labels, node cells, number
// cells, e2e latency columns, Graphite images and rate cells, and the action flow.

import { config, paths } from './config.js';
import { confirmAction } from './dialog.js';
import { h } from './dom.js';
import { commafy, floatToPercent, nanotohuman, percSuffix } from './format.js';
import { fetchRate, graphActive, largeGraphUrl, sparklineUrl } from './graphite.js';

export function alertBox(kind, text) {
    return h('div', {
        class: ['alert', `alert-${kind}`],
        role: kind === 'error' ? 'alert' : 'status',
        'data-alert': kind,
    }, text);
}

/** Go's "Notice" boxes (nothing to show). */
export function notice(title, ...text) {
    return h('div', { class: 'alert alert-notice', 'data-notice': '' },
        h('strong', null, title), ' ', ...text);
}

export function breadcrumb(...items) {
    const last = items.length - 1;
    return h('nav', { 'aria-label': 'Breadcrumb' }, h('ol', { class: 'breadcrumb' },
        items.map(([text, href], i) => h('li', null, i === last || !href
            ? h('span', { 'aria-current': i === last ? 'page' : null }, text)
            : h('a', { href }, text)))));
}

export function label(text, kind = 'primary', title = null) {
    return h('span', { class: ['label', `label-${kind}`], title }, text);
}

export function pausedLabel() {
    return h('span', { class: 'label label-paused', 'data-paused': '' }, 'paused');
}

/** A number cell (right-aligned, Go's commafy), tagged with its column for tests and CSS. */
export function num(value, col, extra) {
    return h('td', { class: 'num', 'data-col': col }, commafy(value), extra || null);
}

/** "memory + disk" as Go prints it. */
export function memDisk(mem, disk) {
    return h('td', { class: 'num', 'data-col': 'memory_disk' }, `${commafy(mem)} + ${commafy(disk)}`);
}

/** Go's hostname:port display of a node (with the address when the hostname differs). */
export function nodeLink(node, hostname) {
    const i = node.lastIndexOf(':');
    const port = node.slice(i + 1);
    const address = node.slice(0, i).replace(/^\[|\]$/g, '');
    const host = hostname || address;
    const hostPort = `${host}:${port}`;
    if (host.toLowerCase() !== address.toLowerCase()) {
        return [hostPort, ' (', h('a', { href: paths.node(node) }, node), ')'];
    }
    return h('a', { href: paths.node(node) }, hostPort);
}

/** The e2e latency header cells (one per percentile) and the group header. */
export function e2eHeads(agg) {
    const ps = (agg && agg.percentiles) || [];
    return ps.map((p) => h('th', { class: 'num', scope: 'col' },
        String(floatToPercent(p.quantile)), h('sup', null, percSuffix(p.quantile))));
}

export function e2eCount(agg) {
    return ((agg && agg.percentiles) || []).length;
}

/** The e2e latency cells of a row, for the percentiles of `agg` (the header's). */
export function e2eCells(head, agg) {
    const ps = (head && head.percentiles) || [];
    const mine = (agg && agg.percentiles) || [];
    return ps.map((hp) => {
        const p = mine.find((x) => x.quantile === hp.quantile);
        if (!p) return h('td', { class: 'num', 'data-col': `e2e_${hp.quantile}` }, '');
        const title = `${floatToPercent(p.quantile)}: min = ${nanotohuman(p.min)}, max = ${nanotohuman(p.max)}`;
        return h('td', { class: 'num', 'data-col': `e2e_${p.quantile}` },
            h('span', { title }, nanotohuman(p.average)));
    });
}

/** A Graphite sparkline image linking to the large graph. */
export function graphImage(typ, node, ns1, ns2, key, { width = 120, height = 20 } = {}) {
    return h('a', { href: largeGraphUrl(typ, node, ns1, ns2, key), 'data-external': '', class: 'graph-link' },
        h('img', {
            class: 'graphite',
            width,
            height,
            alt: `${key.replace(/_/g, ' ')} graph`,
            src: sparklineUrl(typ, node, ns1, ns2, key),
            loading: 'lazy',
        }));
}

/** A Graphite rate cell, filled from /api/graphite once the page is shown. */
export function graphiteRateCell(target, signal) {
    const td = h('td', { class: 'num rate', 'data-col': 'rate', 'data-target': target }, '…');
    fetchRate(target, signal).then((v) => {
        td.textContent = v;
    }, () => {});
    return td;
}

/** A row of Graphite images under a table row: cells[i] is null or [typ, node, ns1, ns2, key]. */
export function graphRow(cells) {
    if (!graphActive()) return null;
    return h('tr', { class: 'graph-row' }, cells.map((c) => h('td', null, c ? graphImage(...c) : null)));
}

/** An action button, shown only to admins. */
export function actionButton(text, kind, onclick, action) {
    if (!config.isAdmin) return null;
    return h('button', { type: 'button', class: ['btn', `btn-${kind}`], 'data-action': action, onclick }, text);
}

/** The ✘ tombstone/delete link button, shown only to admins. */
export function crossButton(labelText, onclick, data = {}) {
    if (!config.isAdmin) return null;
    return h('button', {
        type: 'button',
        class: 'btn-cross',
        title: labelText,
        'aria-label': labelText,
        onclick,
        dataset: data,
    }, '✘');
}

/**
 * Ask, then run an action: `call` returns the API answer; a WARNING in it is shown after
 * the page is rendered again (or `after` is opened); a failure is shown at once.
 */
export async function act(view, { verb, target, danger = false, detail, call, after, done }) {
    const ok = await confirmAction({ verb, target, danger, detail });
    if (!ok) return false;
    try {
        const data = await call();
        if (data && data.message) view.flash('warning', data.message);
        else if (done) view.flash('success', done);
        if (after) view.navigate(after);
        else view.reload();
        return true;
    } catch (err) {
        if (err && err.name === 'AbortError') return false;
        view.error(err.message || String(err));
        return false;
    }
}

/** Live pages refresh their tables every 10 s (or two sample intervals), in place. */
export function refreshEvery(view, el, fn) {
    if (!config.series.enabled) return;
    view.every(Math.max(10, 2 * config.series.interval) * 1000, fn, el);
}
