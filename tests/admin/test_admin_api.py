"""The admin API on one gateway with the embedded default store (SQLite in a data directory;
docs/spec.md §28): keys made, used, limited, blocked, rotated, deleted; the refusals; a restart
that keeps what an admin made; the outsider's tricks."""

from __future__ import annotations

import hashlib
import logging
import time

import httpx2
import pytest

from gateway.config import Config, ConfigError
from tests.admin.admin_support import (
    ADMIN,
    ADMIN_KEY,
    admin,
    admin_toml,
    bearer,
    chat,
    code,
)
from tests.identities.jwks_support import AUDIENCE, ISSUER, jwks, rsa_key, unsigned_token
from tests.support import GatewayServer, gateway_config

__all__ = ["jwks"]  # the fixture

CONFIG_KEY = "config-key-" + "c" * 30


def config(tmp_path) -> Config:
    digest = hashlib.sha256(CONFIG_KEY.encode()).hexdigest()
    keys = f'[[auth.keys]]\ntenant = "ops"\nsha256 = "{digest}"\nadmin = true\n'
    return gateway_config(admin_toml(keys, f'data_dir = "{tmp_path}"'))


def start(gateway, tmp_path) -> GatewayServer:
    server: GatewayServer = gateway(config(tmp_path))
    return server


def test_a_key_made_by_the_api_is_served_limited_and_shown_once(gateway, tmp_path, caplog):
    caplog.set_level(logging.INFO, "gateway")
    gw = start(gateway, tmp_path)
    made = admin(gw.url, "POST", "keys", {"tenant": "team-a", "models": ["gpt-4o*"], "rpm": 100})
    assert made.status_code == 201
    secret, key_id = made.json()["key"], made.json()["id"]
    assert made.json()["prefix"] == secret[:14] and made.json()["managed_by"] == "api"
    assert chat(gw.url, secret).status_code == 200
    refused = chat(gw.url, secret, model="claude-sonnet-4")
    assert refused.status_code == 403 and code(refused) == "model_not_allowed"
    shown = admin(gw.url, "GET", f"keys/{key_id}").json()
    assert "key" not in shown and "digest" not in shown and shown["rpm"] == 100
    listed = admin(gw.url, "GET", "keys").json()["data"]
    assert {k["managed_by"] for k in listed} == {"config", "api"}
    me = httpx2.get(f"{gw.url}/_gateway/api/me", headers=bearer(secret)).json()
    assert me["tenant"] == "team-a" and me["models"] == ["gpt-4o*"] and me["rpm"] == 100
    text = caplog.text
    assert '"audit":"key.create"' in text and key_id in text
    assert secret not in text and secret[14:] not in text and ADMIN_KEY not in text


def test_block_rotate_delete_and_a_replayed_key(gateway, tmp_path):
    gw = start(gateway, tmp_path)
    made = admin(gw.url, "POST", "keys", {"tenant": "team-a"}).json()
    old, key_id = made["key"], made["id"]
    assert admin(gw.url, "POST", f"keys/{key_id}/block").status_code == 200
    assert code(chat(gw.url, old)) == "key_blocked"
    assert admin(gw.url, "POST", f"keys/{key_id}/unblock").json()["blocked"] is False
    assert chat(gw.url, old).status_code == 200
    rotated = admin(gw.url, "POST", f"keys/{key_id}/rotate", {"grace_s": 60}).json()
    new = rotated["key"]
    assert new != old and rotated["grace_until"]
    assert chat(gw.url, new).status_code == 200 and chat(gw.url, old).status_code == 200
    again = admin(gw.url, "POST", f"keys/{key_id}/rotate", {"grace_s": 0}).json()["key"]
    assert chat(gw.url, again).status_code == 200
    assert code(chat(gw.url, new)) == "invalid_api_key"  # no grace: gone at once
    assert chat(gw.url, old).status_code == 200  # the first rotation's grace still runs
    assert admin(gw.url, "DELETE", f"keys/{key_id}").json()["deleted"] is True
    for secret in (old, again):
        assert code(chat(gw.url, secret)) == "invalid_api_key"
    assert admin(gw.url, "GET", f"keys/{key_id}").status_code == 404


def test_an_expired_key_is_refused(gateway, tmp_path):
    gw = start(gateway, tmp_path)
    made = admin(gw.url, "POST", "keys", {"tenant": "t", "expires_at": time.time() + 3600})
    secret, key_id = made.json()["key"], made.json()["id"]
    assert chat(gw.url, secret).status_code == 200
    admin(gw.url, "PATCH", f"keys/{key_id}", {"expires_at": "2020-01-01T00:00:00Z"})
    refused = chat(gw.url, secret)
    assert refused.status_code == 401 and code(refused) == "key_expired"


def test_a_budget_raised_at_runtime_admits_the_next_request(gateway, tmp_path):
    gw = start(gateway, tmp_path)
    made = admin(gw.url, "POST", "keys", {"tenant": "t", "budget_usd": 1e-7}).json()
    refused = chat(gw.url, made["key"])
    assert refused.status_code == 429 and code(refused) == "budget_exceeded"
    assert admin(gw.url, "PATCH", f"keys/{made['id']}", {"budget_usd": 10}).status_code == 200
    assert chat(gw.url, made["key"]).status_code == 200
    spend = admin(gw.url, "GET", f"keys/{made['id']}").json()["spend"]
    assert spend[0]["budget_usd"] == 10 and spend[0]["spent_usd"] > 0


def test_tenants_with_budgets_and_the_config_ones_read_only(gateway, tmp_path):
    gw = start(gateway, tmp_path)
    made = admin(gw.url, "POST", "tenants", {"name": "lab", "budget_usd": 1e-7})
    assert made.status_code == 201
    assert admin(gw.url, "POST", "tenants", {"name": "lab"}).status_code == 409
    made_key = admin(gw.url, "POST", "keys", {"tenant": "lab"}).json()
    key = made_key["key"]
    assert code(chat(gw.url, key)) == "budget_exceeded"  # the tenant's budget
    admin(gw.url, "PATCH", "tenants/lab", {"budget_usd": 5})
    assert chat(gw.url, key).status_code == 200
    got = admin(gw.url, "GET", "tenants/lab").json()
    assert got["budget_usd"] == 5 and got["spend"][0]["spent_usd"] > 0
    assert code(admin(gw.url, "DELETE", "tenants/lab")) == "tenant_in_use"
    assert admin(gw.url, "DELETE", f"keys/{made_key['id']}").status_code == 200
    assert admin(gw.url, "DELETE", "tenants/lab").status_code == 200
    assert admin(gw.url, "GET", "tenants/lab").status_code == 404
    config_id = next(k["id"] for k in admin(gw.url, "GET", "keys").json()["data"])
    changed = admin(gw.url, "PATCH", f"keys/{config_id}", {"rpm": 1})
    assert changed.status_code == 409 and code(changed) == "managed_by_config"


def test_a_restart_keeps_the_keys_an_admin_made(gateway, tmp_path):
    first = GatewayServer(config(tmp_path)).start()
    try:
        secret = admin(first.url, "POST", "keys", {"tenant": "kept"}).json()["key"]
    finally:
        first.stop()
    again = start(gateway, tmp_path)
    assert chat(again.url, secret).status_code == 200
    assert [k["tenant"] for k in admin(again.url, "GET", "keys").json()["data"]] == ["ops", "kept"]


@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [
        ({}, 401, "missing_api_key"),
        ({"authorization": "Bearer wrong"}, 401, "invalid_api_key"),
        ({"authorization": f"Bearer {ADMIN_KEY[:-1]}"}, 401, "invalid_api_key"),
        ({"authorization": f"Bearer {CONFIG_KEY}"}, 403, "admin_required"),
    ],
)
def test_the_admin_api_refuses_who_is_no_admin(gateway, tmp_path, headers, status, error):
    gw = start(gateway, tmp_path)
    answer = httpx2.get(f"{gw.url}/admin/v1/keys", headers=headers)
    assert answer.status_code == status
    body = answer.json()["error"]
    assert body["code"] == error and body["type"] and body["message"]


def test_a_store_key_is_no_admin(gateway, tmp_path):
    gw = start(gateway, tmp_path)
    secret = admin(gw.url, "POST", "keys", {"tenant": "t"}).json()["key"]
    answer = httpx2.get(f"{gw.url}/admin/v1/keys", headers=bearer(secret))
    assert answer.status_code == 403 and code(answer) == "admin_required"


@pytest.mark.parametrize(
    "path",
    ["keys/..%2F..%2Fetc", "keys/key_zz", "keys/%00", "tenants/..", "tenants/a%2Fb", "nothing"],
)
def test_ids_with_path_tricks_are_not_found(gateway, tmp_path, path):
    gw = start(gateway, tmp_path)
    answer = httpx2.get(f"{gw.url}/admin/v1/{path}", headers=ADMIN)
    assert answer.status_code in (400, 404)
    assert answer.json()["error"]["message"]


def test_bodies_are_bounded_and_checked(gateway, tmp_path):
    gw = start(gateway, tmp_path)
    huge = b'{"tenant": "t", "metadata": {"x": "' + b"a" * 2_000_000 + b'"}}'
    with httpx2.Client() as client:
        answer = client.post(f"{gw.url}/admin/v1/keys", content=huge, headers=ADMIN)
    assert answer.status_code == 413
    for bad in (
        {"tenant": "../x"},
        {"tenant": "t", "rpm": -1},
        {"tenant": "t", "budget_usd": float("1e30")},
        {"tenant": "t", "models": []},
        {"tenant": "t", "metadata": {"x": "a" * 5000}},
        {"tenant": "t", "secret": "mine"},
        [1, 2],
    ):
        answer = admin(gw.url, "POST", "keys", bad)
        assert answer.status_code == 400, bad
        assert answer.json()["error"]["type"] == "invalid_request_error"


def test_the_openapi_document_is_served(gateway, tmp_path):
    gw = start(gateway, tmp_path)
    doc = httpx2.get(f"{gw.url}/admin/v1/openapi.json").json()
    assert doc["openapi"].startswith("3.") and "/admin/v1/keys/{id}/rotate" in doc["paths"]


def test_a_jwt_admin_may_use_the_api_and_a_plain_subject_may_not(gateway, tmp_path, jwks):
    key = rsa_key("k1")
    jwks.keys = [key]
    issuer = f"""
[[auth.jwt]]
issuer = "{ISSUER}"
audiences = ["{AUDIENCE}"]
jwks_url = "{jwks.url}"
algorithms = ["RS256"]
admin_groups = ["gw-admins"]
[[auth.jwt.grants]]
tenant = "research"
groups = ["ml"]
"""
    gw = gateway(gateway_config(admin_toml(issuer, f'data_dir = "{tmp_path}"')))
    root = key.token(sub="root", groups=["ml", "gw-admins"])
    alice = key.token(sub="alice", groups=["ml"])
    made = httpx2.post(f"{gw.url}/admin/v1/keys", json={"tenant": "t"}, headers=bearer(root))
    assert made.status_code == 201
    refused = httpx2.get(f"{gw.url}/admin/v1/keys", headers=bearer(alice))
    assert refused.status_code == 403 and code(refused) == "admin_required"
    forged = httpx2.get(f"{gw.url}/admin/v1/keys", headers=bearer(unsigned_token("k1")))
    assert forged.status_code == 401
    assert forged.json()["error"]["type"] == "authentication_error"


def test_config_checks_of_admin():
    with pytest.raises(ConfigError) as caught:
        gateway_config(admin_toml(admin_extra='listen = "9901"\npoll_s = 5'))
    text = "\n".join(caught.value.errors)
    assert 'admin.listen: must be "host:port"' in text and "admin.poll_s" in text
    without = '[[backends]]\nname = "m"\nurl = "mock://"\n[[routes]]\nmodels = ["*"]\n'
    without += 'backends = ["m"]\n[auth]\nmode = "keys"\n'
    with pytest.raises(ConfigError):
        gateway_config(without)  # no key, no issuer, no admin key: nobody could call
    assert gateway_config(admin_toml()).admin.key_env  # keys made at runtime will do
    with pytest.raises(ConfigError, match=r"admin\.store"):
        gateway_config(admin_toml(admin_extra='store = "redis"'))  # no Redis to keep them in


def test_the_admin_key_is_compared_as_digests_in_constant_time(gateway, tmp_path, monkeypatch):
    """Every admin credential goes through one hmac.compare_digest of two sha256 digests: the
    time does not depend on how many leading characters of the key were right."""
    from gateway.admin import access

    compared: list[tuple[int, int]] = []
    real = access.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(access.hmac, "compare_digest", spy)
    gw = start(gateway, tmp_path)
    for guess in (ADMIN_KEY[:-1] + "y", "a", ADMIN_KEY + "x", ADMIN_KEY):
        httpx2.get(f"{gw.url}/admin/v1/keys", headers=bearer(guess))
    assert compared == [(32, 32)] * 4


def test_me_answers_a_config_key_without_the_store(gateway):
    digest = hashlib.sha256(CONFIG_KEY.encode()).hexdigest()
    toml = admin_toml(f'[[auth.keys]]\ntenant = "ops"\nsha256 = "{digest}"\nrpm = 7\n')
    gw = gateway(gateway_config(toml.replace('key_env = "TEST_GATEWAY_ADMIN_KEY"', "")))
    me = httpx2.get(f"{gw.url}/_gateway/api/me", headers=bearer(CONFIG_KEY))
    assert me.status_code == 200 and me.json()["tenant"] == "ops" and me.json()["rpm"] == 7
    assert httpx2.get(f"{gw.url}/_gateway/api/me").status_code == 401
    assert admin(gw.url, "GET", "keys").status_code == 404  # no store, no admin API
