// What the server told the page (render_index injects NSQADMIN and Go's globals), and the
// paths under --base-path every link, API call and asset goes through.

const g = globalThis;
const raw = g.NSQADMIN || {};

function pick(value, fallback) {
    return value === undefined || value === null ? fallback : value;
}

export const config = Object.freeze({
    version: pick(raw.version, pick(g.VERSION, '')),
    basePath: pick(raw.base_path, pick(g.BASE_PATH, '/')),
    isAdmin: pick(raw.is_admin, pick(g.IS_ADMIN, true)) === true,
    user: pick(raw.user, ''),
    // nsqpy's --htpasswd-file: signed in by a session (the CSRF token signs its actions) or
    // by HTTP Basic credentials
    login: Object.freeze({
        enabled: Boolean(raw.login && raw.login.enabled),
        via: (raw.login && raw.login.via) || '',
        csrfToken: (raw.login && raw.login.csrf_token) || '',
    }),
    graphEnabled: pick(raw.graph_enabled, pick(g.GRAPH_ENABLED, false)) === true,
    // where the page sends /render: nsqadmin itself with --proxy-graphite
    graphiteUrl: pick(g.GRAPHITE_URL, pick(raw.page_graphite_url, pick(raw.graphite_url, ''))),
    statsdInterval: Number(pick(raw.statsd_interval, pick(g.STATSD_INTERVAL, 60))),
    statsdCounterFormat: pick(raw.statsd_counter_format, pick(g.STATSD_COUNTER_FORMAT, '')),
    statsdGaugeFormat: pick(raw.statsd_gauge_format, pick(g.STATSD_GAUGE_FORMAT, '')),
    statsdPrefix: pick(raw.statsd_prefix, pick(g.STATSD_PREFIX, '')),
    nsqlookupd: pick(raw.nsqlookupd, pick(g.NSQLOOKUPD, [])) || [],
    nsqd: pick(raw.nsqd, []) || [],
    series: Object.freeze({
        enabled: Boolean(raw.series && raw.series.enabled),
        interval: Number((raw.series && raw.series.interval) || 0),
        retention: Number((raw.series && raw.series.retention) || 3600),
    }),
});

/** Go's path.Join(basePath, p): "/admin" + "/nodes" → "/admin/nodes"; "/" + "/" → "/". */
export function basePath(p) {
    const parts = `${config.basePath}/${p}`.split('/');
    const out = [];
    for (const part of parts) {
        if (part === '' || part === '.') continue;
        if (part === '..') out.pop();
        else out.push(part);
    }
    return `/${out.join('/')}`;
}

/** The path of a JSON API endpoint under --base-path. */
export function apiPath(p) {
    return basePath(`/api${p}`);
}

/** A node name (host:port, [v6]:port) in a path: escaped, but readable. */
export function encodeNode(node) {
    return encodeURIComponent(node).replace(/%3A/gi, ':').replace(/%5B/gi, '[').replace(/%5D/gi, ']');
}

/** The page path of a topic, a channel or a node (names are URL-encoded). */
export const paths = {
    streams: () => basePath('/'),
    topic: (topic) => basePath(`/topics/${encodeURIComponent(topic)}`),
    channel: (topic, channel) =>
        basePath(`/topics/${encodeURIComponent(topic)}/${encodeURIComponent(channel)}`),
    nodes: () => basePath('/nodes'),
    node: (node) => basePath(`/nodes/${encodeNode(node)}`),
    lookup: () => basePath('/lookup'),
    counter: () => basePath('/counter'),
};
