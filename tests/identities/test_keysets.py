"""A JWK Set as the gateway reads it: each key pinned to what it may verify, the keys it cannot
use left out with a reason (docs/spec.md §29, RFC 8725 §3.1)."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.identities.keysets import KeySet, parse_jwks
from tests.identities.jwks_support import ec_key, rsa_key


def body(*keys: dict) -> bytes:
    return json.dumps({"keys": list(keys)}).encode()


def test_each_key_is_pinned_to_its_family_or_its_own_alg():
    rsa, ec = rsa_key("r"), ec_key("e")
    keys, problems = parse_jwks(body(rsa.jwk, ec.jwk, {**rsa_key("p").jwk, "alg": "PS384"}))
    assert problems == []
    assert keys["r"].algorithms == {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
    assert keys["e"].algorithms == {"ES256"}
    assert keys["p"].algorithms == {"PS384"}


def test_keys_the_gateway_cannot_use_are_left_out_with_why():
    rsa = rsa_key("r").jwk
    keys, problems = parse_jwks(
        body(
            {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},  # a published secret
            {**rsa, "kid": "liar", "alg": "HS256"},  # an RSA key claiming HS256
            {**rsa, "kid": "es", "alg": "ES256"},
            {**ec_key("k").jwk, "crv": "P-192"},
            {**rsa, "kid": "enc", "use": "enc"},  # for encryption: skipped, no problem
            rsa,
            {**rsa_key("r").jwk},  # the same kid again: the first wins
            "not an object",
        )
    )
    assert list(keys) == ["r"]
    assert len(problems) == 6
    assert "'oct' is not accepted" in problems[0]
    assert "'HS256' does not fit" in problems[1]
    assert "listed twice" in problems[4]


@pytest.mark.parametrize("raw", [b"<html>", b"[]", b'{"keys": {}}', b"{}"])
def test_an_answer_that_is_no_jwk_set_is_an_error(raw):
    with pytest.raises(ValueError, match="not"):
        parse_jwks(raw)


def test_a_failed_fetch_keeps_the_keys_known():
    answers = [body(rsa_key("r").jwk), b"oops"]

    async def fetch(url: str) -> bytes:
        return answers.pop(0)

    async def run() -> None:
        ks = KeySet("http://idp.test/jwks", 300, fetch)
        assert await ks.fetch_once() is True
        assert await ks.fetch_once() is False
        assert list(ks.keys) == ["r"] and ks.state()["error"] == "the answer is not JSON"

    asyncio.run(run())


def test_an_unknown_kid_fetches_once_per_cooldown():
    """Twenty wake-ups within the cooldown: one fetch after the first (a clock the test moves)."""
    now = [100.0]
    fetched: list[float] = []

    async def fetch(url: str) -> bytes:
        fetched.append(now[0])
        return body(rsa_key("r").jwk)

    async def run() -> None:
        ks = KeySet("http://idp.test/jwks", 300, fetch, clock=lambda: now[0])
        task = asyncio.create_task(ks.run())
        await asyncio.sleep(0.05)
        assert fetched == [100.0]
        for _ in range(20):
            ks.want_refresh()
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert fetched == [100.0]  # the cooldown holds it
        task.cancel()

    asyncio.run(run())


def test_the_set_is_fetched_again_every_refresh_period():
    fetched: list[int] = []

    async def fetch(url: str) -> bytes:
        fetched.append(1)
        return body(rsa_key("r").jwk)

    async def run() -> None:
        ks = KeySet("http://idp.test/jwks", 0.05, fetch)
        task = asyncio.create_task(ks.run())
        for _ in range(200):  # bounded: 10 s
            if len(fetched) >= 3:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        assert len(fetched) >= 3

    asyncio.run(run())
