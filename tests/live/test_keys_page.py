"""The live view's Keys page (docs/spec.md §28) in Debian chromium: signed in with the admin key
only, it lists the keys (the config's and the store's) with their spend, creates one (its
secret shown once), and revokes one — each change checked against the gateway itself."""

from __future__ import annotations

import hashlib

from tests.admin.admin_support import ADMIN_KEY, admin, admin_toml, chat
from tests.live.test_view import chromium
from tests.support import GatewayServer, gateway_config

CONFIG_KEY = "config-key-" + "p" * 30


def start(gateway, tmp_path) -> GatewayServer:
    digest = hashlib.sha256(CONFIG_KEY.encode()).hexdigest()
    keys = f'[[auth.keys]]\ntenant = "ops"\nsha256 = "{digest}"\nadmin = true\n'
    toml = admin_toml(keys, f'data_dir = "{tmp_path}"') + "[ui]\nenabled = true\n"
    server: GatewayServer = gateway(gateway_config(toml))
    return server


def rows(page) -> dict[str, dict[str, str]]:
    return {
        r["id"]: r
        for r in page.evaluate(
            """() => [...document.querySelectorAll('#keys tbody tr.key')].map(tr => ({
                 id: tr.dataset.id,
                 tenant: tr.querySelector('.tenant').textContent,
                 prefix: tr.querySelector('.prefix').textContent,
                 state: tr.querySelector('.state').textContent,
                 spent: tr.querySelector('.spent').textContent,
                 managed: tr.querySelector('.managed').textContent,
                 revocable: tr.querySelector('button.revoke') !== null}))"""
        )
    }


def test_the_keys_page_lists_creates_and_revokes(gateway, tmp_path):
    gw = start(gateway, tmp_path)
    spender = admin(gw.url, "POST", "keys", {"tenant": "lab", "budget_usd": 5}).json()
    assert chat(gw.url, spender["key"]).status_code == 200  # something spent
    with chromium() as (page, errors):
        page.goto(f"{gw.url}/_gateway/keys")
        assert page.locator("#keys-view").is_hidden()
        for wrong in ("not-the-key", CONFIG_KEY):  # an admin = true API key is no admin key
            page.fill("#signin-key", wrong)
            page.click("#signin-form button")
            page.wait_for_function("() => document.querySelector('#signin-message').textContent")
            assert page.locator("#keys-view").is_hidden()
            page.evaluate("() => { document.querySelector('#signin-message').textContent = ''; }")
        page.fill("#signin-key", ADMIN_KEY)
        page.click("#signin-form button")
        page.wait_for_selector("#keys tbody tr.key")
        shown = rows(page)
        assert shown[spender["id"]]["prefix"] == spender["prefix"] + "…"
        assert float(shown[spender["id"]]["spent"]) > 0
        configured = [r for r in shown.values() if r["managed"] == "config"]
        assert len(configured) == 1 and not configured[0]["revocable"]

        page.fill("#c-tenant", "team-b")
        page.fill("#c-models", "gpt-4o*")
        page.fill("#c-budget", "3")
        page.click("#create-form button")
        page.wait_for_selector("#secret-box:not([hidden])")
        secret = page.text_content("#secret")
        assert secret and secret.startswith("sk-gw-")
        assert chat(gw.url, secret).status_code == 200
        made = next(r for r in rows(page).values() if r["tenant"] == "team-b")
        assert made["state"] == "active" and secret not in str(rows(page))
        page.click("#secret-done")
        assert secret not in page.content()

        page.click(f"tr[data-id='{made['id']}'] button.revoke")
        page.wait_for_function(
            "id => !document.querySelector(`tr[data-id='${id}']`)", arg=made["id"]
        )
        assert chat(gw.url, secret).status_code == 401
        # the browser logs each refused sign-in's answers (401, 403); nothing else went wrong
        refused = [e for e in errors if "status of 401" in e or "status of 403" in e]
        assert refused and errors == refused


def test_with_its_own_listener_the_page_says_where_the_admin_api_is(gateway, tmp_path):
    """``[admin] listen``: the admin API is not on the view's port (a 404 there): the admin
    key is refused with a message that says why, not a bare 404."""
    toml = (
        admin_toml("", f'data_dir = "{tmp_path}"\nlisten = "127.0.0.1:9"')
        + "[ui]\nenabled = true\n"
    )
    gw = gateway(gateway_config(toml))  # in a thread: the admin socket is not bound here
    with chromium() as (page, errors):
        page.goto(f"{gw.url}/_gateway/keys")
        page.fill("#signin-key", ADMIN_KEY)
        page.click("#signin-form button")
        page.wait_for_function("() => document.querySelector('#signin-message').textContent")
        assert "[admin] listen" in page.text_content("#signin-message")
        assert page.locator("#keys-view").is_hidden()
        assert errors and all("status of 404" in e for e in errors)
