"""Affinity (docs/spec.md §21): the keys a request carries, rendezvous hashing (stable, spread,
minimal movement, the same in every process) and what each attempt records (hit, spill, none),
driven through the upstream hop against fake transports."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from gateway.config import BackendConfig, RouteConfig
from gateway.context import Call
from gateway.fleet.affinity import PREFIX_BYTES, Rendezvous, prompt_prefix, request_key, session_id
from gateway.fleet.health import Health
from gateway.fleet.load import Load
from gateway.routes import Backend, Route
from tests.hops.test_upstream import (
    Clock,
    FakeTransport,
    context,
    no_backoff,  # noqa: F401 (autouse)
    run,
)


def named(name: str, metrics: bool = False) -> Backend:
    cfg = BackendConfig(
        name=name,
        url=f"http://{name}.test/v1",
        metrics_url=f"http://{name}.test/metrics" if metrics else None,
        eject_after=1,
    )
    return Backend(cfg, FakeTransport([200]), environ={})  # type: ignore[arg-type]


FLEET = tuple(named(n) for n in ("vllm-0", "vllm-1", "vllm-2"))


def keys(n: int) -> list[int]:
    return [request_key("session", {"user": f"user-{i}"}, "m", []) or 0 for i in range(n)]


# ---------------------------------------------------------------- the keys


@pytest.mark.parametrize(
    ("payload", "headers", "session"),
    [
        ({"prompt_cache_key": "pck", "user": "u", "metadata": {"user_id": "m"}}, [], "pck"),
        ({"user": "u", "metadata": {"user_id": "claude-session"}}, [], "claude-session"),
        ({"user": "u"}, [(b"x-session-id", b"h")], "u"),
        ({}, [(b"x-session-id", b"from-header")], "from-header"),
        ({"prompt_cache_key": "", "user": 7, "metadata": "x"}, [], None),  # empty, not strings
        ({"metadata": {"user_id": None}}, [], None),
    ],
)
def test_the_session_a_request_names(payload, headers, session):
    assert session_id(payload, headers) == session


def test_session_mode_without_a_session_has_no_key_prefix_mode_hashes_the_prompt():
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert request_key("session", payload, "m", []) is None
    prefix = request_key("prefix", payload, "m", [])
    assert prefix is not None and prefix == request_key("prefix", dict(payload), "m", [])
    assert request_key("prefix", payload, "other-model", []) != prefix  # the model is part of it
    with_session = {**payload, "user": "u"}
    assert request_key("prefix", with_session, "m", []) == request_key(
        "session", with_session, "m", []
    )


LONG_SYSTEM = "You are a careful assistant. " * 100  # > 2 KiB


@pytest.mark.parametrize(
    "make",
    [
        lambda q: {
            "messages": [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": q}]
        },
        lambda q: {
            "system": [{"type": "text", "text": LONG_SYSTEM}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": q}]}],
        },
        lambda q: {"instructions": LONG_SYSTEM, "input": q},
        lambda q: {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": LONG_SYSTEM + q}]}
            ]
        },
        lambda q: {"prompt": LONG_SYSTEM + q},
    ],
    ids=["chat", "messages", "responses", "responses-items", "completions"],
)
def test_the_prefix_is_the_first_2_kib_of_the_prompt_in_every_api(make):
    one, two = make("What is a gateway?"), make("Something else entirely")
    assert prompt_prefix(one) == prompt_prefix(two)  # the opening decides, not the tail
    assert len(prompt_prefix(one)) == PREFIX_BYTES
    assert prompt_prefix(one).startswith(b"You are a careful assistant.")


def test_a_short_prompt_is_its_whole_text_and_differs_with_it():
    a = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"}]}
    b = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "b"}]}
    assert prompt_prefix(a) != prompt_prefix(b)
    assert prompt_prefix({"messages": "not a list", "prompt": None}) == b"not a list"
    deep: Any = "x"
    for _ in range(50):
        deep = [deep]
    assert prompt_prefix({"messages": deep}) == b""  # nesting is bounded, not recursed forever


# ---------------------------------------------------------------- rendezvous hashing


def test_a_key_keeps_its_backend_and_keys_spread_evenly():
    r = Rendezvous(FLEET)
    ks = keys(3000)
    first = [r.rank(k)[0].name for k in ks]
    assert first == [r.rank(k)[0].name for k in ks]  # 100 % while the fleet is stable
    spread = Counter(first)
    assert len(spread) == 3 and min(spread.values()) > 800, spread
    assert all(sorted(b.name for b in r.rank(k)) == sorted(b.name for b in FLEET) for k in ks[:50])


def test_when_a_backend_leaves_only_its_keys_move_and_to_their_next_in_hash_order():
    before = Rendezvous(FLEET)
    after = Rendezvous(FLEET[:2])  # vllm-2 left
    for k in keys(2000):
        ranked = before.rank(k)
        now = after.rank(k)[0]
        if ranked[0].name != "vllm-2":
            assert now is ranked[0]
        else:
            assert now is ranked[1]


def test_when_a_backend_joins_only_keys_that_now_prefer_it_move():
    grown = (*FLEET, named("vllm-3"))
    before, after = Rendezvous(FLEET), Rendezvous(grown)
    moved = 0
    for k in keys(2000):
        was, now = before.rank(k)[0], after.rank(k)[0]
        if now is not was:
            assert now.name == "vllm-3"
            moved += 1
    assert 350 < moved < 650  # about a quarter


def test_every_process_hashes_alike():
    """Replicas must agree: the hash is not Python's per-process salted hash()."""
    code = (
        "from gateway.fleet.affinity import Rendezvous, request_key\n"
        "from tests.fleet.test_affinity import FLEET\n"
        "r = Rendezvous(FLEET)\n"
        "print([r.rank(request_key('session', {'user': f'u{i}'}, 'm', []))[0].name"
        " for i in range(40)])\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


# ---------------------------------------------------------------- through the upstream hop


def routed(*backends: Backend, clock: Clock | None = None, **cfg: Any):
    from gateway.hops.upstream import Upstream

    config = RouteConfig(models=("*",), backends=tuple(b.name for b in backends), **cfg)
    route = Route(config, backends)
    health = Health(backends, (route,), clock=clock or Clock(), rng=random.Random(5))
    return Upstream(health=health), health, route


def call_for(route: Route, payload: dict[str, Any], headers: list[tuple[bytes, bytes]] = ()):
    ctx = context()
    ctx.scope["headers"] = list(headers)
    ctx.model = payload.get("model", "m")
    ctx.call = Call("/v1/chat/completions", "chat", b"{}", payload, False, route)
    return ctx


async def send(up, health, route, payload, headers=()):
    ctx = call_for(route, {"model": "m", **payload}, headers)
    resp, _ = await up.forward(ctx, route.backends, b"{}", 1)
    await resp.aclose()
    health.finished(ctx)
    return ctx


def test_attempts_record_hit_spill_and_none():
    a, b, c = named("a", metrics=True), named("b", metrics=True), named("c", metrics=True)
    clock = Clock()
    up, health, route = routed(a, b, c, clock=clock, affinity="session")
    ctx = run(send(up, health, route, {"user": "alice"}))
    home = ctx.attempts[0].backend
    assert [x.affinity for x in ctx.attempts] == ["hit"]
    ctx = run(send(up, health, route, {"messages": []}))  # no session: no key
    assert [x.affinity for x in ctx.attempts] == ["none"]
    # its preferred backend saturates: the next in hash order, recorded as a spill
    health.publish(home, Load(7, 2, 0.5, True, clock.now, clock.now + 1))
    ctx = run(send(up, health, route, {"user": "alice"}))
    assert ctx.attempts[0].backend is not home and ctx.attempts[0].affinity == "spill"
    assert ctx.attempts[0].load is None  # that backend's load is unknown
    next_in_line = Rendezvous(route.backends).rank(
        request_key("session", {"user": "alice"}, "m", []) or 0
    )[1]
    assert ctx.attempts[0].backend is next_in_line
    health.publish(home, Load(1, 2, 0.5, False, clock.now, clock.now + 1))
    ctx = run(send(up, health, route, {"user": "alice"}))
    assert ctx.attempts[0].backend is home and ctx.attempts[0].load == (1, 0.5)


def test_a_failed_preferred_backend_falls_back_in_hash_order_and_spills():
    from gateway.errors import UpstreamConnectError

    a, b, c = named("a"), named("b"), named("c")
    up, health, route = routed(a, b, c, affinity="session", retries=0)
    payload = {"user": "bob"}
    ranked = Rendezvous(route.backends).rank(request_key("session", payload, "m", []) or 0)
    ranked[0].transport.script = [UpstreamConnectError("refused")]  # type: ignore[attr-defined]
    ctx = run(send(up, health, route, payload))
    assert [x.backend for x in ctx.attempts] == [ranked[0], ranked[1]]
    assert [x.affinity for x in ctx.attempts] == ["hit", "spill"]
    ctx = run(send(up, health, route, payload))  # ejected (eject_after = 1): a spill at once
    assert [x.backend for x in ctx.attempts] == [ranked[1]]
    assert ctx.attempts[0].affinity == "spill"


def test_routes_without_affinity_or_load_record_nothing():
    a, b = named("a"), named("b")
    up, health, route = routed(a, b)
    ctx = run(send(up, health, route, {"user": "carol"}))
    assert ctx.attempts[0].affinity is None and ctx.attempts[0].load is None
