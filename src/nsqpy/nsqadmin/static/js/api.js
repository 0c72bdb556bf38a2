// nsqadmin's JSON API: every call under --base-path, errors worded as Go's UI words them
// (the server's "message", or "ERROR: failed to connect to nsqadmin"). With a login
// (--htpasswd-file) every change carries the session's CSRF token, and a 401 (the session
// ended) goes to the login page.

import { apiPath, basePath, config } from './config.js';

export class ApiError extends Error {
    constructor(message, status) {
        super(message);
        this.name = 'ApiError';
        this.status = status;
    }
}

/**
 * One request: resolves to the decoded JSON body (an object), rejects with ApiError
 * (message as the server gave it) or an AbortError when `signal` fires.
 */
export async function request(method, path, { body, signal } = {}) {
    const init = { method, signal, credentials: 'same-origin', headers: { 'X-Requested-With': 'nsqadmin' } };
    if (method !== 'GET' && config.login.csrfToken) init.headers['X-CSRF-Token'] = config.login.csrfToken;
    if (body !== undefined) {
        init.body = JSON.stringify(body);
        init.headers['Content-Type'] = 'application/json';
    }
    let resp;
    try {
        resp = await fetch(apiPath(path), init);
    } catch (err) {
        if (err && err.name === 'AbortError') throw err;
        throw new ApiError('ERROR: failed to connect to nsqadmin', 0);
    }
    const text = await resp.text();
    let data = null;
    if (text) {
        try {
            data = JSON.parse(text);
        } catch (err) {
            throw new ApiError(`ERROR: failed to decode JSON - ${err.message}`, resp.status);
        }
    }
    if (!resp.ok) {
        let msg = data && typeof data.message === 'string' && data.message
            ? data.message
            : `ERROR: HTTP ${resp.status}`;
        if (resp.status === 401 && config.login.enabled) {
            toLogin();
            msg = 'Your session has ended: sign in again';
        } else if (msg === 'INVALID_CSRF_TOKEN') {
            msg = 'INVALID_CSRF_TOKEN: nsqadmin refused the action, as it did not carry this '
                + 'session\'s security token. Reload the page and try again.';
        }
        throw new ApiError(msg, resp.status);
    }
    return data && typeof data === 'object' ? data : {};
}

/** The login page, coming back here after. */
export function toLogin() {
    const here = window.location.pathname + window.location.search;
    window.location.assign(`${basePath('/login')}?next=${encodeURIComponent(here)}`);
}

export const get = (path, opts) => request('GET', path, opts);
export const post = (path, body, opts) => request('POST', path, { ...opts, body });
export const del = (path, body, opts) => request('DELETE', path, { ...opts, body });
