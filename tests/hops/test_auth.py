"""The auth hop on its own (gateway/hops/auth.py): the caller's key as the request's typed fact,
and the admit step a metered model call owes until the router has parsed its body."""

from __future__ import annotations

import asyncio
import hashlib
import logging

from gateway.config import AuthConfig, AuthKeyConfig
from gateway.context import RequestContext, Timeline
from gateway.hops.auth import Auth

KEY = b"sk-hop-test"


def hop(**limits: int) -> Auth:
    entry = AuthKeyConfig("t1", hashlib.sha256(KEY).hexdigest(), **limits)  # type: ignore[arg-type]
    return Auth(AuthConfig(mode="keys", keys=(entry,)))


def request(method: str = "POST", path: str = "/v1/chat/completions") -> RequestContext:
    ctx = RequestContext({"method": method, "path": path}, Timeline())
    ctx.credential = KEY
    return ctx


def test_the_key_is_the_request_s_fact_and_a_metered_model_call_owes_its_admit_step():
    auth = hop(tpm=1000)
    ctx = request()
    asyncio.run(auth.check(ctx))
    key = ctx.limit_key
    assert key is not None and key.digest == hashlib.sha256(KEY).digest()
    assert key.tenant == "t1" and key.metered and not key.budgeted
    assert ctx.answer.admission_due
    asyncio.run(auth.admit(ctx, None, upstream=False))  # type: ignore[arg-type]  # a cache hit
    assert not ctx.answer.admission_due and ctx.answer.reservation == ""


def test_an_unmetered_key_and_a_passthrough_path_owe_nothing():
    ctx = request()
    asyncio.run(hop(rpm=10).check(ctx))  # rpm only: checked at once
    assert ctx.limit_key is not None and not ctx.limit_key.metered
    assert not ctx.answer.admission_due
    ctx = request("GET", "/v1/models")
    asyncio.run(hop(tpm=1000).check(ctx, passthrough=True))
    assert not ctx.answer.admission_due


def test_a_metered_model_call_that_skipped_its_admit_step_is_logged_once(caplog):
    auth = hop(tpm=1000)
    with caplog.at_level(logging.ERROR, logger="gateway.auth"):
        for _ in range(2):
            ctx = request()
            asyncio.run(auth.check(ctx))
            ctx.call = object()  # type: ignore[assignment]  # routed, but admit() never ran
            auth.finished(ctx)
        admitted = request()
        asyncio.run(auth.check(admitted))
        asyncio.run(auth.admit(admitted, None, upstream=False))  # type: ignore[arg-type]
        admitted.call = object()  # type: ignore[assignment]
        auth.finished(admitted)
    logged = [r for r in caplog.records if "without Auth.admit" in r.getMessage()]
    assert len(logged) == 1
