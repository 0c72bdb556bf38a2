// The confirmation asked before every action: a modal <dialog> (focus trapped by the
// browser, Escape cancels), resolving to true only when the action button is pressed.

import { h } from './dom.js';

let current = null;

/**
 * confirmAction({verb: 'delete', target: 'orders', detail: 'text', danger: true})
 * → Promise<boolean>. The question reads "Are you sure you want to <verb> <target>?".
 */
export function confirmAction({ verb, target, detail, danger = false, button }) {
    if (current) current.close('cancel');
    return new Promise((resolve) => {
        const title = h('h2', { id: 'confirm-title' }, 'Please confirm');
        const question = h('p', { id: 'confirm-question' },
            'Are you sure you want to ', h('strong', null, verb), ' ',
            h('em', null, target), '?');
        const cancel = h('button', { type: 'button', class: 'btn', value: 'cancel' }, 'Cancel');
        const ok = h('button', {
            type: 'button',
            class: ['btn', danger ? 'btn-danger' : 'btn-primary'],
            value: 'ok',
            'data-confirm': '',
        }, button || verb.charAt(0).toUpperCase() + verb.slice(1));
        const dialog = h('dialog', {
            class: 'confirm',
            'aria-labelledby': 'confirm-title',
            'aria-describedby': 'confirm-question',
        },
        title,
        question,
        detail ? h('p', { class: 'muted' }, detail) : null,
        h('div', { class: 'dialog-buttons' }, cancel, ok));
        cancel.addEventListener('click', () => dialog.close('cancel'));
        ok.addEventListener('click', () => dialog.close('ok'));
        dialog.addEventListener('close', () => {
            current = null;
            dialog.remove();
            resolve(dialog.returnValue === 'ok');
        });
        document.body.appendChild(dialog);
        current = dialog;
        dialog.showModal();
        (danger ? cancel : ok).focus();
    });
}

/** Close an open confirmation (navigation away). */
export function closeDialogs() {
    if (current) current.close('cancel');
}
