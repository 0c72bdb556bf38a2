// The login page: focus the first empty field; and, since the session cookie is
// SameSite=Strict, a page reached from a link on another site arrives here without it even
// when signed in: ask again from this page (same-site now) and go on if the session is there.

const form = document.querySelector('form[data-form="login"]');
const user = document.getElementById('login-user');
const password = document.getElementById('login-password');
(user.value ? password : user).focus();

const here = form.getAttribute('action');
fetch(`${here.replace(/\/login$/, '')}/api/session`, {
    credentials: 'same-origin',
    headers: { 'X-Requested-With': 'nsqadmin' },
}).then((resp) => {
    if (resp.ok) window.location.replace(form.elements.next.value);
}, () => {});
