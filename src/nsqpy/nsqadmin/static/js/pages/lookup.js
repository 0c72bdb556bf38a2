// Lookup (/lookup): the nsqlookupd, the topics and channels they list that no nsqd
// produces (with ✘ to delete them), and the form that creates a topic/channel.

import { del, get, post } from '../api.js';
import { config, paths } from '../config.js';
import { h } from '../dom.js';
import { act, crossButton, notice } from '../widgets.js';

export async function render(view) {
    view.title('Lookup');
    const el = view.el;
    el.append(h('h1', null, 'Lookup'));
    if (!config.nsqlookupd.length) {
        el.append(notice('Notice', 'nsqadmin is not configured with nsqlookupd hosts'));
        return;
    }
    const data = await get('/topics?inactive=true', { signal: view.signal });
    view.warn(data.message);

    el.append(h('div', { class: 'table-wrap narrow' }, h('table', { class: 'table', 'data-table': 'lookupd' },
        h('thead', null, h('tr', null, h('th', { scope: 'col' }, 'nsqlookupd Host'))),
        h('tbody', null, config.nsqlookupd.map((addr) => h('tr', null, h('td', null, addr)))))));

    const topics = Object.entries(data.topics || {});
    const inactive = h('section', { 'aria-labelledby': 'inactive' }, h('h2', { id: 'inactive' }, 'Inactive topics'));
    el.append(inactive);
    if (!topics.length) {
        inactive.append(notice('Notice', 'No inactive Topics'));
    } else {
        const deleteTopic = (topic) => () => act(view, {
            verb: 'delete',
            target: topic,
            danger: true,
            detail: 'The topic is deleted from every nsqlookupd (and any nsqd that has it).',
            call: () => del(`/topics/${encodeURIComponent(topic)}`),
            done: `Deleted topic ${topic}.`,
        });
        const deleteChannel = (topic, channel) => () => act(view, {
            verb: 'delete',
            target: `${topic}/${channel}`,
            danger: true,
            detail: 'The channel is deleted from every nsqlookupd (and any nsqd that has it).',
            call: () => del(`/topics/${encodeURIComponent(topic)}/${encodeURIComponent(channel)}`),
            done: `Deleted channel ${topic}/${channel}.`,
        });
        inactive.append(
            h('p', { class: 'alert alert-info' },
                'Topics and channels that nsqlookupd lists but no nsqd in the cluster produces.'),
            h('ul', { class: 'tree', 'data-tree': 'inactive' }, topics.map(([topic, channels]) => h('li', { 'data-topic': topic },
                crossButton(`Delete topic ${topic}`, deleteTopic(topic), { topic }),
                ' ', h('a', { href: paths.topic(topic) }, topic),
                (channels || []).length ? h('ul', null, channels.map((channel) => h('li', { 'data-channel': channel },
                    crossButton(`Delete channel ${topic}/${channel}`, deleteChannel(topic, channel), { topic, channel }),
                    ' ', h('a', { href: paths.channel(topic, channel) }, channel)))) : null))));
    }

    if (!config.isAdmin) return;
    const topicInput = h('input', { type: 'text', name: 'topic', id: 'create-topic', required: true, autocomplete: 'off', pattern: '[.a-zA-Z0-9_\\-]+(#ephemeral)?', maxlength: 64 });
    const channelInput = h('input', { type: 'text', name: 'channel', id: 'create-channel', autocomplete: 'off', pattern: '[.a-zA-Z0-9_\\-]+(#ephemeral)?', maxlength: 64 });
    const form = h('form', { class: 'create-form', 'data-form': 'create', novalidate: true },
        h('h2', null, 'Create Topic/Channel'),
        h('p', { class: 'muted' },
            'This provides a way to set up a stream hierarchy before services are deployed to production. ',
            'If the channel name is empty, just the topic is created.'),
        h('div', { class: 'form-row' },
            h('label', { for: 'create-topic' }, 'Topic name'), topicInput),
        h('div', { class: 'form-row' },
            h('label', { for: 'create-channel' }, 'Channel name ', h('span', { class: 'muted' }, '(optional)')), channelInput),
        h('button', { type: 'submit', class: 'btn btn-primary' }, 'Create'));
    form.addEventListener('submit', (e) => {
        e.preventDefault();
        const topic = topicInput.value.trim();
        const channel = channelInput.value.trim();
        if (!topic) {
            view.error('Enter a topic name.');
            topicInput.focus();
            return;
        }
        act(view, {
            verb: 'create',
            target: channel ? `${topic}/${channel}` : topic,
            detail: 'nsqlookupd will list it (nsqd creates it when it is first used).',
            call: () => post('/topics', { topic, channel }),
            done: channel ? `Created topic ${topic} and channel ${channel}.` : `Created topic ${topic}.`,
        });
    });
    el.append(form);
}
