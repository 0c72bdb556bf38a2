// A small History API router: page paths under --base-path, same-origin link clicks
// handled without a reload, back/forward restored.

import { config } from './config.js';

function compile(pattern) {
    const segs = pattern.split('/').filter(Boolean);
    return (parts) => {
        if (parts.length !== segs.length) return null;
        const params = {};
        for (let i = 0; i < segs.length; i++) {
            const seg = segs[i];
            if (seg.startsWith(':')) {
                if (!parts[i]) return null;
                try {
                    params[seg.slice(1)] = decodeURIComponent(parts[i]);
                } catch {
                    return null;
                }
            } else if (seg !== parts[i]) {
                return null;
            }
        }
        return params;
    };
}

export class Router {
    /** routes: [[pattern, name]]; onRoute(name, params, url) is called on every change. */
    constructor(routes, onRoute) {
        this.routes = routes.map(([pattern, name]) => ({ name, match: compile(pattern) }));
        this.onRoute = onRoute;
        const base = config.basePath.replace(/\/+$/, '');
        this.base = base;
    }

    /** The app path of a location path ("/admin/nodes" → "/nodes"), or null outside. */
    appPath(pathname) {
        if (!this.base) return pathname;
        if (pathname === this.base) return '/';
        if (pathname.startsWith(`${this.base}/`)) return pathname.slice(this.base.length);
        return null;
    }

    match(pathname) {
        const p = this.appPath(pathname);
        if (p === null) return null;
        const parts = p.split('/').filter(Boolean);
        for (const route of this.routes) {
            const params = route.match(parts);
            if (params) return { name: route.name, params };
        }
        return null;
    }

    start() {
        window.addEventListener('popstate', () => this.dispatch());
        document.addEventListener('click', (e) => this.onClick(e));
        this.dispatch();
    }

    onClick(e) {
        if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) {
            return;
        }
        const a = e.target.closest('a[href]');
        if (!a || a.target || a.hasAttribute('download') || a.dataset.external !== undefined) return;
        const url = new URL(a.href, window.location.href);
        if (url.origin !== window.location.origin || !this.match(url.pathname)) return;
        e.preventDefault();
        this.navigate(url.pathname + url.search + url.hash);
    }

    /** Go to `url` (a path under --base-path) without reloading the page. */
    navigate(url, { replace = false } = {}) {
        if (replace) window.history.replaceState(null, '', url);
        else window.history.pushState(null, '', url);
        this.dispatch();
    }

    /** Render the current location again (after an action). */
    reload() {
        this.dispatch({ keepScroll: true });
    }

    dispatch(opts = {}) {
        const m = this.match(window.location.pathname);
        this.onRoute(m ? m.name : null, m ? m.params : {}, opts);
    }
}
