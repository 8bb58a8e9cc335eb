"""A store tenant is not deleted from under its keys (docs/spec.md §28): the delete is refused
(409 ``tenant_in_use``) while a live key names it, so a key never silently loses its tenant's
budget and grant narrowing; and a key whose tenant is a tombstone anyway (a key made on another
replica while the delete ran) is refused, not widened."""

from __future__ import annotations

import hashlib

import pytest

from gateway.errors import Unauthorized
from gateway.hops.stored_keys import StoredEntries
from gateway.keys.index import KeyIndex
from tests.admin.admin_support import admin, chat, code
from tests.admin.test_admin_api import start


def test_a_tenant_with_live_keys_is_not_deleted(gateway, tmp_path) -> None:
    gw = start(gateway, tmp_path)
    made = admin(gw.url, "POST", "tenants", {"name": "acme", "budget_usd": 0.000001})
    assert made.status_code == 201, made.text
    key = admin(gw.url, "POST", "keys", {"tenant": "acme"}).json()
    assert chat(gw.url, key["key"]).status_code == 429  # the tenant's budget bounds it
    refused = admin(gw.url, "DELETE", "tenants/acme")
    assert refused.status_code == 409 and code(refused) == "tenant_in_use", refused.text
    assert key["id"] in refused.json()["error"]["message"]
    assert admin(gw.url, "GET", "tenants/acme").status_code == 200
    assert chat(gw.url, key["key"]).status_code == 429  # still bounded
    assert admin(gw.url, "DELETE", f"keys/{key['id']}").status_code == 200
    assert admin(gw.url, "DELETE", "tenants/acme").status_code == 200
    again = admin(gw.url, "POST", "keys", {"tenant": "acme"})
    assert again.status_code == 409 and code(again) == "tenant_deleted", again.text
    assert admin(gw.url, "POST", "tenants", {"name": "acme"}).status_code == 201
    assert admin(gw.url, "POST", "keys", {"tenant": "acme"}).status_code == 201


def test_a_key_of_a_deleted_tenant_fails_closed() -> None:
    digest = hashlib.sha256(b"secret").hexdigest()
    index = KeyIndex()
    tenant = {"kind": "tenant", "name": "acme", "budget_usd": 1.0, "version": 1}
    key = {"kind": "key", "id": "key_" + "0" * 16, "tenant": "acme", "digest": digest}
    index.apply(tenant)
    index.apply({**key, "old": [], "blocked": False, "version": 2})
    entries = StoredEntries(index, {})
    assert entries.find(bytes.fromhex(digest)) is not None
    index.apply({"kind": "tenant", "name": "acme", "deleted": True, "version": 3})
    with pytest.raises(Unauthorized) as refused:
        entries.find(bytes.fromhex(digest))
    assert refused.value.code == "tenant_deleted"
