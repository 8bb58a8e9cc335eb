"""The admin API's bodies are checked before anything is written (docs/spec.md §28): an
``expires_at`` no date can show (milliseconds, ±1e20, negative) or metadata nested too deep is
a 400 ``invalid_field`` in the OpenAI shape, and the keys stay listable; nothing under
``/admin/v1`` answers a plain-text 500."""

from __future__ import annotations

import time

import pytest

from tests.admin.admin_support import admin, code
from tests.admin.test_admin_api import start


@pytest.mark.parametrize(
    "expires_at", [1e20, -1e20, -1, int(time.time() * 1000), 253402300800, "0001-01-01T00:00:00Z"]
)
def test_an_expires_at_out_of_range_is_refused(gateway, tmp_path, expires_at) -> None:
    gw = start(gateway, tmp_path)
    made = admin(gw.url, "POST", "keys", {"tenant": "t", "expires_at": expires_at})
    assert made.status_code == 400 and code(made) == "invalid_field", made.text
    assert "expires_at" in made.json()["error"]["message"]
    key = admin(gw.url, "POST", "keys", {"tenant": "t"}).json()
    changed = admin(gw.url, "PATCH", f"keys/{key['id']}", {"expires_at": expires_at})
    assert changed.status_code == 400 and code(changed) == "invalid_field", changed.text
    listed = admin(gw.url, "GET", "keys")
    assert listed.status_code == 200
    assert [k["expires_at"] for k in listed.json()["data"] if k["id"] == key["id"]] == [None]
    assert admin(gw.url, "GET", "spend").status_code == 200


def test_the_bounds_of_expires_at_are_taken(gateway, tmp_path) -> None:
    gw = start(gateway, tmp_path)
    for at, shown in ((0, "1970-01-01T00:00:00Z"), (253402300799, "9999-12-31T23:59:59Z")):
        made = admin(gw.url, "POST", "keys", {"tenant": "t", "expires_at": at})
        assert made.status_code == 201 and made.json()["expires_at"] == shown, made.text
    assert admin(gw.url, "GET", "keys").status_code == 200
