// nsqadmin's single-page app: the router, the page lifecycle (abort and timers on leave),
// the alerts area and the header (graph timeframe, read-only badge).

import { ApiError } from './api.js';
import { basePath, config } from './config.js';
import { closeDialogs } from './dialog.js';
import { h, mount } from './dom.js';
import { GRAPH_INTERVALS, graphInterval, setGraphInterval } from './graphite.js';
import { Router } from './router.js';
import { alertBox } from './widgets.js';

import * as channel from './pages/channel.js';
import * as counter from './pages/counter.js';
import * as lookup from './pages/lookup.js';
import * as node from './pages/node.js';
import * as nodes from './pages/nodes.js';
import * as streams from './pages/streams.js';
import * as topic from './pages/topic.js';

const PAGES = { streams, topic, channel, nodes, node, counter, lookup };
const NAV = { streams: 'streams', topic: 'streams', channel: 'streams', nodes: 'nodes', node: 'nodes', counter: 'counter', lookup: 'lookup' };

const ROUTES = [
    ['/', 'streams'],
    ['/topics', 'streams'],
    ['/topics/:topic', 'topic'],
    ['/topics/:topic/:channel', 'channel'],
    ['/nodes', 'nodes'],
    ['/nodes/:node', 'node'],
    ['/counter', 'counter'],
    ['/lookup', 'lookup'],
];

const main = document.getElementById('main');
const alerts = document.getElementById('alerts');
let current = null;
let pendingFlash = [];
let firstRender = true;

/** What a page gets: where to draw, when to stop, and how to talk to the user. */
class View {
    constructor(router, name, params) {
        this.router = router;
        this.name = name;
        this.params = params;
        this.controller = new AbortController();
        this.signal = this.controller.signal;
        this.cleanups = [];
        this.el = h('div', { class: ['page', `page-${name}`], 'data-page': name });
        this.closed = false;
    }

    onCleanup(fn) {
        this.cleanups.push(fn);
    }

    /** setTimeout that stops when the page is left. */
    later(fn, ms) {
        const id = setTimeout(() => {
            if (!this.closed) fn();
        }, ms);
        this.onCleanup(() => clearTimeout(id));
        return id;
    }

    /**
     * Run `fn` every `ms` (after the previous run finished) while the page is shown; a run
     * is skipped while a dialog is open or `busyEl` holds the focus (the user is on it).
     */
    every(ms, fn, busyEl) {
        const tick = async () => {
            const busy = document.querySelector('dialog[open]')
                || (busyEl && busyEl.contains(document.activeElement) && document.activeElement !== busyEl);
            if (!busy && !document.hidden) {
                try {
                    await fn();
                } catch (err) {
                    if (this.closed || (err && err.name === 'AbortError')) return;
                    this.error(err.message || String(err));
                }
            }
            if (!this.closed) this.later(tick, ms);
        };
        this.later(tick, ms);
    }

    close() {
        this.closed = true;
        this.controller.abort();
        for (const fn of this.cleanups.splice(0)) {
            try {
                fn();
            } catch (err) {
                console.error(err);
            }
        }
    }

    title(text) {
        document.title = text ? `${text} · nsqadmin` : 'nsqadmin';
    }

    navigate(path) {
        this.router.navigate(path);
    }

    reload() {
        this.router.reload();
    }

    /** Show (or clear, with "") the warning of the data shown (Go's #warning). */
    warn(text) {
        if (!this.closed) setAlert('warning', text);
    }

    /** Show an error (Go's #error): an action or a refresh failed. */
    error(text) {
        if (this.closed) return;
        setAlert('warning', '');
        setAlert('error', text);
    }

    /** A message shown after the next render (the result of an action). */
    flash(kind, text) {
        pendingFlash.push([kind, text]);
    }
}

function setAlert(kind, text) {
    const old = alerts.querySelector(`[data-alert="${kind}"]`);
    if (!text) {
        if (old) old.remove();
        return;
    }
    const box = alertBox(kind, text);
    if (old) old.replaceWith(box);
    else alerts.appendChild(box);
}

function markNav(name) {
    for (const a of document.querySelectorAll('[data-nav]')) {
        if (a.dataset.nav === NAV[name]) a.setAttribute('aria-current', 'page');
        else a.removeAttribute('aria-current');
    }
}

async function show(router, name, params, opts) {
    if (current) current.close();
    closeDialogs();
    alerts.replaceChildren();
    const flashes = pendingFlash;
    pendingFlash = [];
    markNav(name);
    const view = new View(router, name, params);
    current = view;
    if (!opts.keepScroll) window.scrollTo(0, 0);
    main.setAttribute('aria-busy', 'true');
    mount(main, h('div', { class: 'loading' }, 'Loading…'));
    if (!name) {
        view.title('Not found');
        mount(main, view.el);
        view.el.append(alertBox('error', `No page at ${window.location.pathname}`));
    } else {
        try {
            await PAGES[name].render(view, params);
            if (view.closed) return;
            mount(main, view.el);
        } catch (err) {
            if (view.closed || (err && err.name === 'AbortError')) return;
            if (!(err instanceof ApiError)) console.error(err); // a bug, not an answer
            // Go's handleViewError: the page becomes the error
            mount(main, view.el);
            view.el.replaceChildren(alertBox('error', err.message || String(err)));
        }
    }
    main.removeAttribute('aria-busy');
    for (const [kind, text] of flashes) setAlert(kind, text);
    if (!firstRender && !opts.keepScroll) main.focus({ preventScroll: true });
    firstRender = false;
    document.dispatchEvent(new CustomEvent('nsqadmin:rendered', { detail: { page: name } }));
}

function header(router) {
    const slot = document.getElementById('graph-interval-slot');
    if (slot && config.graphEnabled) {
        const select = h('select', { id: 'graph-interval', 'aria-label': 'Graph timeframe' },
            GRAPH_INTERVALS.map((v) => h('option', { value: v, selected: v === graphInterval() }, v)));
        select.addEventListener('change', () => {
            setGraphInterval(select.value);
            router.reload();
        });
        mount(slot, h('label', { class: 'graph-interval' }, h('span', null, 'Graphs'), select));
    }
    const user = document.getElementById('user-slot');
    if (user) {
        mount(user,
            config.user ? h('span', { class: 'user', title: 'signed-in user', 'data-user': '' }, config.user) : null,
            config.isAdmin ? null : h('span', { class: 'label label-muted', 'data-readonly': '', title: 'actions need an --admin-user' }, 'read-only'),
            config.login.via === 'session' ? logoutForm() : null);
    }
}

/** Sign out (a session: HTTP Basic credentials cannot be forgotten by a page). */
function logoutForm() {
    return h('form', { class: 'logout-form', method: 'post', action: basePath('/logout'), 'data-form': 'logout' },
        h('input', { type: 'hidden', name: 'csrf_token', value: config.login.csrfToken }),
        h('button', { type: 'submit', class: 'btn btn-xs' }, 'Sign out'));
}

const router = new Router(ROUTES, (name, params, opts) => {
    show(router, name, params, opts);
});
header(router);
router.start();
