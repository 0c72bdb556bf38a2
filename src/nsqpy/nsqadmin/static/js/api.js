// nsqadmin's JSON API: every call under --base-path, errors worded as Go's UI words them
// (the server's "message", or "ERROR: failed to connect to nsqadmin").

import { apiPath } from './config.js';

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
    const init = { method, signal, credentials: 'same-origin', headers: {} };
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
        const msg = data && typeof data.message === 'string' && data.message
            ? data.message
            : `ERROR: HTTP ${resp.status}`;
        throw new ApiError(msg, resp.status);
    }
    return data && typeof data === 'object' ? data : {};
}

export const get = (path, opts) => request('GET', path, opts);
export const post = (path, body, opts) => request('POST', path, { ...opts, body });
export const del = (path, body, opts) => request('DELETE', path, { ...opts, body });
