"""Sign-in identities end to end (docs/spec.md §29): the gateway on a loopback port, its issuer's
JWK Set served by a real HTTP server, keys generated here, the openai SDK as the client."""

from __future__ import annotations

import logging
import time

import httpx2
import openai
import pytest

from gateway.identities import COOLDOWN_S
from gateway.identities.tokens import Issuer
from tests.identities.jwks_support import (
    AUDIENCE,
    ISSUER,
    JwksServer,
    ec_key,
    hs_confusion_token,
    jwks,
    rsa_key,
    unsigned_token,
)
from tests.support import GatewayServer, gateway_config, openai_client

__all__ = ["jwks"]  # the fixture

MESSAGES = [{"role": "user", "content": "hi"}]


def sign_in_toml(jwks_url: str, extra: str = "") -> str:
    return f"""
[[backends]]
name = "mock"
url = "mock://?output_tokens=10"
[[routes]]
models = ["*"]
backends = ["mock"]
[logging]
access_log = "all"
[auth]
mode = "keys"
[[auth.jwt]]
issuer = "{ISSUER}"
audiences = ["{AUDIENCE}", "other-app"]
jwks_url = "{jwks_url}"
algorithms = ["RS256", "ES256"]
tenant_claim = "tenant"
admin_groups = ["gw-admins"]
leeway_s = 30
[[auth.jwt.grants]]
tenant = "research"
groups = ["ml"]
models = ["gpt-4o*"]
subject_budget_usd = 1.0
subject_budget_period = "day"
[[auth.jwt.grants]]
tenant = "support"
models = ["claude-*"]
[[prices]]
models = ["gpt-4o*"]
input = 0.0
output = 50000.0
{extra}
"""


def start(gateway, jwks: JwksServer, extra: str = "") -> GatewayServer:
    server: GatewayServer = gateway(gateway_config(sign_in_toml(jwks.url, extra)))
    return server


def chat(gw: GatewayServer, token: str, model: str = "gpt-4o") -> str | None:
    client = openai_client(gw.base_url, api_key=token)
    answer = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10)
    return answer.choices[0].message.content


def refused(gw: GatewayServer, token: str, model: str = "gpt-4o") -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        chat(gw, token, model)
    return caught.value


def code_of(err: openai.APIStatusError) -> str | None:
    body = err.body
    return body.get("code") if isinstance(body, dict) else None


def test_a_token_of_either_key_type_is_served_as_its_tenant(gateway, jwks, access_lines):
    """RS256 and ES256 tokens through the openai SDK; the tenant is the grant's."""
    rsa, ec = rsa_key("r1"), ec_key("e1")
    jwks.keys = [rsa, ec]
    gw = start(gateway, jwks)
    assert chat(gw, rsa.token(groups=["ml"]))
    assert chat(gw, ec.token(sub="bob", tenant="support"), model="claude-sonnet-4")
    # each line is written as its request ends, after the answer's last byte: wait for both
    _wait(lambda: len(access_lines) >= 2, "both access-log lines", 5)
    tenants = [line.get("tenant") for line in access_lines if line.get("status") == 200]
    assert tenants == ["research", "support"]


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda k: k.token(exp_in=-120, groups=["ml"]), "expired"),
        (lambda k: k.token(aud="somebody-else", groups=["ml"]), "not meant for this gateway"),
        (lambda k: k.token(iss="https://evil.test", groups=["ml"]), "issuer is not accepted"),
        (lambda k: k.token(sub=None, groups=["ml"]), "no 'sub' claim"),
        (lambda k: k.token(exp=None, groups=["ml"]), "no 'exp' claim"),
        (lambda k: unsigned_token(k.kid, groups=["ml"]), "algorithm 'none' is not accepted"),
        (lambda k: hs_confusion_token(k, groups=["ml"]), "algorithm 'HS256' is not accepted"),
        (lambda k: k.token(groups=["ml"])[:-4] + "AAAA", "signature does not verify"),
        # an ES256 token naming the RSA key: the key's pin refuses it before any check
        (lambda k: ec_key(k.kid).token(groups=["ml"]), "does not fit the key"),
        (lambda k: "eyJ" + "x" * 40 + ".e30.", "not a valid JWT"),
    ],
)
def test_a_token_that_does_not_verify_is_401(gateway, jwks, caplog, make, why):
    key = rsa_key("r1")
    jwks.keys = [key]
    gw = start(gateway, jwks)
    token = make(key)
    with caplog.at_level(logging.DEBUG):
        err = refused(gw, token)
    assert err.status_code == 401 and code_of(err) == "invalid_token"
    assert why in err.message
    assert err.response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert token not in caplog.text  # tokens are never logged


def test_an_hs_token_is_refused_even_when_the_issuer_lists_hs256(tmp_path):
    """The other half of the confusion attack: HS* cannot be configured at all."""
    from gateway.config import ConfigError

    toml = sign_in_toml("http://127.0.0.1:1/jwks").replace(
        'algorithms = ["RS256", "ES256"]', 'algorithms = ["RS256", "HS256", "none"]'
    )
    with pytest.raises(ConfigError) as caught:
        gateway_config(toml)
    assert sum("auth.jwt[0].algorithms" in e for e in caught.value.errors) == 1


def test_claims_map_to_a_tenant_and_its_grants(gateway, jwks):
    key = rsa_key("r1")
    jwks.keys = [key]
    gw = start(gateway, jwks)
    # groups -> research: gpt-4o* only
    assert chat(gw, key.token(groups=["ml", "staff"]))
    err = refused(gw, key.token(groups=["ml"]), model="claude-sonnet-4")
    assert err.status_code == 403 and code_of(err) == "model_not_allowed"
    # the tenant claim wins over the groups, and must be granted
    err = refused(gw, key.token(tenant="support", groups=["ml"]))
    assert err.status_code == 403 and code_of(err) == "model_not_allowed"
    err = refused(gw, key.token(tenant="finance", groups=["ml"]))
    assert err.status_code == 403 and code_of(err) == "tenant_not_granted"
    err = refused(gw, key.token(groups=["nobody-grants-this"]))
    assert err.status_code == 403 and code_of(err) == "tenant_not_granted"
    err = refused(gw, key.token(tenant=["research"]))  # not a string: no tenant
    assert err.status_code == 403 and code_of(err) == "tenant_not_granted"


def test_each_subject_spends_its_own_budget(gateway, jwks):
    """subject_budget_usd: each subject of the tenant has its own ($1 a day here; 10 output
    tokens at $0.05 cost $0.50)."""
    key = rsa_key("r1")
    jwks.keys = [key]
    gw = start(gateway, jwks)
    alice = key.token(sub="alice", groups=["ml"])
    spent = 0
    for _ in range(4):
        try:
            chat(gw, alice)
        except openai.RateLimitError as exc:
            assert code_of(exc) == "budget_exceeded"
            break
        spent += 1
    assert spent == 2  # $0.50 twice; a third would pass $1
    client = httpx2.Client(base_url=gw.url)
    answer = client.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 10},
        headers={"authorization": f"Bearer {key.token(sub='bob', groups=['ml'])}"},
    )
    assert answer.status_code == 200
    assert float(answer.headers["x-gateway-budget-remaining-usd"]) == pytest.approx(1.0)
    client.close()


def test_an_admin_group_opens_the_live_view(gateway, jwks):
    key = rsa_key("r1")
    jwks.keys = [key]
    gw = start(gateway, jwks)
    with httpx2.Client(base_url=gw.url) as client:
        path = "/_gateway/api/requests"
        admin = key.token(sub="root", groups=["ml", "gw-admins"])
        plain = key.token(sub="alice", groups=["ml"])
        assert client.get(path, headers={"authorization": f"Bearer {admin}"}).status_code == 200
        assert client.get(path, headers={"authorization": f"Bearer {plain}"}).status_code == 403
        # a cookie session is signed in with an admin key only
        answer = client.post("/_gateway/api/session", headers={"authorization": f"Bearer {admin}"})
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "admin_key_required"


def test_a_reused_token_is_verified_once(gateway, jwks, monkeypatch):
    key = rsa_key("r1")
    jwks.keys = [key]
    calls: list[str] = []
    verify = Issuer.verify

    def counted(self, token, header):
        calls.append(token)
        return verify(self, token, header)

    monkeypatch.setattr(Issuer, "verify", counted)
    gw = start(gateway, jwks)
    token = key.token(tenant="support")
    for _ in range(3):
        assert chat(gw, token, model="claude-sonnet-4")
    assert len(calls) == 1
    assert chat(gw, key.token(sub="bob", tenant="support"), model="claude-sonnet-4")
    assert len(calls) == 2


def _wait(predicate, what: str, within: float) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.05)


def test_a_rotated_key_is_picked_up_by_a_cooldown_bounded_refresh(gateway, jwks):
    """The issuer rotates: its JWK Set now holds only a new key. A token of the new kid is a
    401 at once and wakes one fetch (many such tokens: still one per 10 s); once fetched it is
    served, and a token of the retired key — remembered or not — is refused."""
    old, new = rsa_key("2024"), rsa_key("2025")
    jwks.keys = [old]
    gw = start(gateway, jwks)
    remembered = old.token(groups=["ml"])
    assert chat(gw, remembered)
    assert jwks.fetches == 1  # at start, before the gateway listened
    jwks.keys = [new]
    for i in range(20):  # unknown kids: refused, never fetched on the request path
        err = refused(gw, new.token(sub=f"user{i}", groups=["ml"]))
        assert err.status_code == 401 and "does not know" in err.message
    assert jwks.fetches <= 2
    _wait(lambda: jwks.fetches == 2, "the refresh after the cooldown", COOLDOWN_S + 5)
    _wait(lambda: _served(gw, new.token(groups=["ml"])), "the new key served", 5)
    assert jwks.fetches == 2
    err = refused(gw, remembered)
    assert err.status_code == 401 and "does not know" in err.message


def _served(gw: GatewayServer, token: str) -> bool:
    try:
        return chat(gw, token) is not None
    except openai.AuthenticationError:
        return False


def test_with_the_jwks_server_down_known_keys_keep_working(gateway, jwks):
    key = rsa_key("r1")
    jwks.keys = [key]
    gw = start(gateway, jwks)
    assert chat(gw, key.token(groups=["ml"]))
    jwks.stop()
    assert chat(gw, key.token(sub="bob", groups=["ml"]))  # a new token of a known key
    err = refused(gw, rsa_key("r2").token(groups=["ml"]))
    assert err.status_code == 401 and code_of(err) == "invalid_token"
    with httpx2.Client(base_url=gw.url) as client:
        ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["sign_in"][jwks.url]["keys"] == 1


def test_a_gateway_whose_issuer_is_down_at_start_still_starts(gateway, jwks):
    key = rsa_key("r1")
    jwks.keys = [key]
    jwks.stop()
    gw = start(gateway, jwks)
    err = refused(gw, key.token(groups=["ml"]))
    assert err.status_code == 401
    with httpx2.Client(base_url=gw.url) as client:
        state = client.get("/readyz").json()["sign_in"][jwks.url]
    assert state["keys"] == 0 and state["error"]
