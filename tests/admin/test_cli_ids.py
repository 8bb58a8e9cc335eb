"""The CLI puts no id into a URL the server would not take (docs/spec.md §28): an id or a
tenant's name is checked against the server's patterns and quoted as one path segment, so
``gateway keys revoke ../tenants/acme`` deletes nothing (exit 2) and the tenant stays."""

from __future__ import annotations

import pytest

from tests.admin.admin_support import admin
from tests.admin.test_admin_api import start
from tests.admin.test_cli import cli


@pytest.mark.parametrize(
    "args",
    [
        ("keys", "revoke", "../tenants/acme"),
        ("keys", "block", "../../admin/v1/tenants/acme"),
        ("keys", "get", "key_0123456789abcdef/../../tenants/acme"),
        ("keys", "revoke", "%2e%2e%2ftenants%2facme"),
        ("tenants", "delete", "acme/../acme"),
        ("tenants", "create", "../x"),
    ],
)
def test_an_id_with_path_tricks_changes_nothing(gateway, tmp_path, args) -> None:
    gw = start(gateway, tmp_path)
    assert admin(gw.url, "POST", "tenants", {"name": "acme", "budget_usd": 5}).status_code == 201
    done = cli(gw.url, *args)
    assert done.returncode == 2, (done.stdout, done.stderr[-300:])
    assert "not an id" in done.stderr
    assert admin(gw.url, "GET", "tenants/acme").status_code == 200, "the tenant was deleted"


def test_good_ids_still_work(gateway, tmp_path) -> None:
    gw = start(gateway, tmp_path)
    made = admin(gw.url, "POST", "keys", {"tenant": "t.a-1"}).json()
    assert cli(gw.url, "keys", "block", made["id"]).returncode == 0
    assert admin(gw.url, "GET", f"keys/{made['id']}").json()["blocked"] is True
    assert cli(gw.url, "tenants", "create", "t.a-1").returncode == 0
    assert cli(gw.url, "tenants", "get", "t.a-1").returncode == 0
    config_id = next(k["id"] for k in admin(gw.url, "GET", "keys").json()["data"])
    assert config_id.startswith("config_")
    assert cli(gw.url, "keys", "get", config_id).returncode == 0
