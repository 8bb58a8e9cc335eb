// The live view's Keys page (docs/spec.md §28): the admin API driven from the browser. The
// admin key lives in a variable of this page only (never storage, never a cookie); every value
// shown is set as text, never as markup.
'use strict';

const $ = (id) => document.getElementById(id);
let adminKey = null;
let timer = null;
// a 404 from /admin/v1/: the API has a listener of its own, off this port (docs/spec.md §28)
const NOT_HERE = 'The admin API is not served on this port: [admin] listen gives it a listener ' +
  'of its own. Manage keys there (gateway keys … --url http://HOST:PORT, or the API).';

async function api(method, path, body) {
  const init = { method, cache: 'no-store', headers: { authorization: 'Bearer ' + adminKey } };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const answer = await fetch('/admin/v1/' + path, init);
  const data = await answer.json().catch(() => ({}));
  if (!answer.ok) {
    const message = (data.error && data.error.message) || 'HTTP ' + answer.status;
    const err = new Error(message);
    err.status = answer.status;
    throw err;
  }
  return data;
}

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text === null || text === undefined ? '' : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function money(v) {
  return typeof v === 'number' ? v.toFixed(6) : '';
}

function state(key) {
  if (key.blocked) return 'blocked';
  if (key.expired) return 'expired';
  return 'active';
}

function row(key, spent) {
  const tr = document.createElement('tr');
  tr.dataset.id = key.id;
  tr.className = 'key';
  cell(tr, key.id, 'id');
  cell(tr, key.tenant, 'tenant');
  cell(tr, key.prefix ? key.prefix + '…' : '', 'prefix');
  cell(tr, (key.models || []).join(', '), 'models');
  cell(tr, state(key), 'state');
  cell(tr, key.budget_usd === null ? '' : key.budget_usd, 'num budget');
  cell(tr, key.budget_usd === null ? '' : key.budget_period, 'period');
  cell(tr, spent ? money(spent.spent_usd) : '', 'num spent');
  cell(tr, spent ? money(spent.remaining_usd) : '', 'num remaining');
  cell(tr, key.managed_by, 'managed');
  const actions = cell(tr, '', 'actions');
  if (key.managed_by === 'api') {
    const revoke = document.createElement('button');
    revoke.type = 'button';
    revoke.className = 'revoke';
    revoke.textContent = 'revoke';
    revoke.addEventListener('click', () => revokeKey(key.id));
    actions.appendChild(revoke);
  }
  return tr;
}

async function refresh() {
  const [keys, spend] = await Promise.all([api('GET', 'keys'), api('GET', 'spend')]);
  const spent = new Map((spend.keys || []).map((r) => [r.key, r]));
  const body = $('keys').querySelector('tbody');
  body.replaceChildren(...keys.data.map((k) => row(k, spent.get(k.id))));
  $('count').textContent = keys.data.length + ' keys';
  $('state').textContent = 'updated ' + new Date().toLocaleTimeString();
}

function fail(err) {
  $('message').textContent = err.message;
  if (err.status === 401 || err.status === 403) signOut(err.message);
}

async function revokeKey(id) {
  $('message').textContent = '';
  try {
    await api('DELETE', 'keys/' + encodeURIComponent(id));
    await refresh();
  } catch (err) {
    fail(err);
  }
}

async function create(event) {
  event.preventDefault();
  $('message').textContent = '';
  const body = { tenant: $('c-tenant').value.trim() };
  const models = $('c-models').value.split(',').map((m) => m.trim()).filter(Boolean);
  if (models.length) body.models = models;
  const budget = $('c-budget').value;
  if (budget !== '') {
    body.budget_usd = Number(budget);
    body.budget_period = $('c-period').value;
  }
  try {
    const made = await api('POST', 'keys', body);
    $('secret').textContent = made.key;
    $('secret-box').hidden = false;
    await refresh();
  } catch (err) {
    fail(err);
  }
}

function signOut(message) {
  adminKey = null;
  if (timer !== null) clearInterval(timer);
  timer = null;
  $('secret').textContent = '';
  $('secret-box').hidden = true;
  $('keys').querySelector('tbody').replaceChildren();
  $('keys-view').hidden = true;
  $('signout').hidden = true;
  $('signin').hidden = false;
  $('signin-message').textContent = message || '';
}

async function signIn(event) {
  event.preventDefault();
  adminKey = $('signin-key').value;
  $('signin-key').value = '';
  try {
    await refresh();
  } catch (err) {
    signOut(err.status === 404 ? NOT_HERE : err.message);
    return;
  }
  $('signin').hidden = true;
  $('signin-message').textContent = '';
  $('keys-view').hidden = false;
  $('signout').hidden = false;
  timer = setInterval(() => refresh().catch(fail), 5000);
}

$('signin-form').addEventListener('submit', signIn);
$('create-form').addEventListener('submit', create);
$('signout').addEventListener('click', () => signOut(''));
$('secret-done').addEventListener('click', () => {
  $('secret').textContent = '';
  $('secret-box').hidden = true;
});
