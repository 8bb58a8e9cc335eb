"""Who is an admin of the admin API (docs/spec.md §28): the admin key in ``Authorization:
Bearer`` only (not ``x-api-key`` / ``api-key``), or a JWT the sign-in identities verify whose
grant is an admin's — a config key with ``admin = true`` shaped like a JWT is still an API key
(403), whatever issuers are set."""

from __future__ import annotations

import hashlib

import httpx2
import pytest

from tests.admin.admin_support import ADMIN_KEY, admin_toml, bearer, code
from tests.admin.test_admin_api import start
from tests.identities.jwks_support import AUDIENCE, ISSUER, jwks, rsa_key
from tests.support import gateway_config

__all__ = ["jwks"]

SHAPED = "eyJsaXZlLXZpZXcta2V5.c2VjcmV0.cGFydA"  # three dot-separated parts, starting "eyJ"


def test_a_jwt_shaped_config_admin_key_is_no_admin(gateway, tmp_path, jwks) -> None:
    jwks.keys = [rsa_key("k1")]
    digest = hashlib.sha256(SHAPED.encode()).hexdigest()
    extra = f"""
[[auth.keys]]
tenant = "ops"
sha256 = "{digest}"
admin = true
[[auth.jwt]]
issuer = "{ISSUER}"
audiences = ["{AUDIENCE}"]
jwks_url = "{jwks.url}"
algorithms = ["RS256"]
[[auth.jwt.grants]]
tenant = "research"
groups = ["ml"]
"""
    gw = gateway(gateway_config(admin_toml(extra, f'data_dir = "{tmp_path}"')))
    url = f"{gw.url}/admin/v1/keys"
    answer = httpx2.post(url, json={"tenant": "x"}, headers=bearer(SHAPED))
    assert answer.status_code == 403 and code(answer) == "admin_required", answer.text
    listed = httpx2.get(url, headers=bearer(SHAPED))
    assert listed.status_code == 403
    assert httpx2.get(f"{gw.url}/_gateway/api/me", headers=bearer(SHAPED)).json()["admin"]


@pytest.mark.parametrize(
    "headers",
    [
        {"x-api-key": ADMIN_KEY},
        {"api-key": ADMIN_KEY},
        {"authorization": f"Basic {ADMIN_KEY}"},
        {"authorization": ADMIN_KEY},
    ],
)
def test_the_admin_key_only_as_a_bearer(gateway, tmp_path, headers) -> None:
    gw = start(gateway, tmp_path)
    answer = httpx2.get(f"{gw.url}/admin/v1/keys", headers=headers)
    assert answer.status_code == 401 and code(answer) == "missing_api_key", answer.text
    for good in (f"Bearer {ADMIN_KEY}", f"bearer  {ADMIN_KEY}"):
        answer = httpx2.get(f"{gw.url}/admin/v1/keys", headers={"authorization": good})
        assert answer.status_code == 200, good
