"""Passive health, the retry budget and the route strategies over real sockets (SPEC §13).

The gateway runs as its own process (`python -m gateway.cli serve`); its backends are
fault-injecting upstreams (:mod:`tests.faults`) on loopback whose behaviour a test changes while
it runs (``FaultyUpstream.default``). What is checked is what each upstream saw (its request
count) and what the gateway says about itself on ``/readyz`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.fleet.health import BUDGET_FLOOR_PER_S, BUDGET_RATIO
from tests.faults import FaultServer, FaultyUpstream, expected_text
from tests.gateway_process import (
    Answer,
    ask,
    backend_toml,
    chat_request,
    gateway_process,
    raise_fd_limit,
)
from tests.support import http_response, openai_client

#: short cool-downs keep the tests short (the default is 30 s)
EJECT_FOR_S = 1.0
NO_CACHE = '[cache]\nbackend = "off"\n'


@pytest.fixture(scope="module", autouse=True)
def fds() -> None:
    raise_fd_limit()


@contextlib.contextmanager
def upstreams(*behaviours: FaultyUpstream) -> Iterator[list[FaultServer]]:
    """One fault server per behaviour, each stopped by its own handle."""
    servers: list[FaultServer] = []
    try:
        for behaviour in behaviours:
            server = FaultServer(behaviour.handler).start()
            server.seen = behaviour.seen
            servers.append(server)
        yield servers
    finally:
        for server in reversed(servers):
            server.stop()


def config(
    servers: list[FaultServer],
    route: str = "",
    backend_extra: str = f"eject_for_s = {EJECT_FOR_S}",
) -> str:
    names = [chr(ord("a") + i) for i in range(len(servers))]
    backends = "".join(
        backend_toml(n, s.url, backend_extra) for n, s in zip(names, servers, strict=True)
    )
    listed = ", ".join(f'"{n}"' for n in names)
    return f'{backends}[[routes]]\nmodels = ["*"]\nbackends = [{listed}]\n{route}\n{NO_CACHE}'


def get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


def backends_ready(port: int) -> dict[str, dict[str, Any]]:
    return dict(get_json(port, "/readyz")["backends"])


def backend_up(port: int) -> dict[str, float]:
    """``gateway_backend_up`` by backend, from the Prometheus text of ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        sample.labels["backend"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gateway_backend_up"
        for sample in family.samples
    }


def chat(port: int, headers: dict[str, str] | None = None) -> Answer:
    return asyncio.run(ask(port, chat_request(port, False, headers)))


def content_of(answer: Answer) -> str:
    return str(json.loads(answer.body)["choices"][0]["message"]["content"])


async def storm(port: int, clients: int, each: int = 1) -> list[Answer]:
    """``clients`` concurrent clients, each sending ``each`` requests one after the other."""

    async def client() -> list[Answer]:
        return [await ask(port, chat_request(port, False)) for _ in range(each)]

    results = await asyncio.gather(*(client() for _ in range(clients)))
    return [a for answers in results for a in answers]


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout} s")
        time.sleep(0.05)


# ---------------------------------------------------------------- ejection and recovery


def client_for(port: int) -> openai.OpenAI:
    return openai_client(f"http://127.0.0.1:{port}/v1")


def complete(client: openai.OpenAI, model: str) -> str:
    """One chat completion for ``model`` through the gateway (it must succeed): its text."""
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}]
    )
    return str(answer.choices[0].message.content)


def models_seen(server: FaultServer) -> list[str]:
    """The model of every request the upstream saw, in order."""
    return [str(json.loads(r.body)["model"]) for r in server.requests]


def failing_for(*models: str) -> FaultyUpstream:
    """An upstream that answers 503 to requests for ``models`` and serves every other one."""
    behaviour = FaultyUpstream()
    clean = behaviour.handler

    async def handler(req: Any, writer: Any) -> bool:
        behaviour.default = "status=503" if json.loads(req.body)["model"] in models else ""
        return await clean(req, writer)

    behaviour.handler = handler  # type: ignore[method-assign]
    return behaviour


def test_one_models_503s_eject_that_model_and_leave_the_backends_others_in_rotation(tmp_path):
    flaky, steady = failing_for("A"), FaultyUpstream()
    # ordered, no retry: each request tries a once, then falls back to b
    with (
        upstreams(flaky, steady) as (a, b),
        gateway_process(tmp_path, config([a, b], "retries = 0", "eject_for_s = 60")) as gw,
    ):
        client = client_for(gw.port)
        for _ in range(5):
            assert complete(client, "A") == expected_text(8)  # b answered every one
        assert (models_seen(a), models_seen(b)) == (["A"] * 5, ["A"] * 5)
        for _ in range(5):
            assert complete(client, "B") == expected_text(8)
            assert complete(client, "A") == expected_text(8)
        assert models_seen(a) == ["A"] * 5 + ["B"] * 5  # A skips a; B is still served there
        assert models_seen(b) == ["A"] * 10
        state = backends_ready(gw.port)["a"]
        assert state["models"] == {"A": "ejected"} and state["model_ejections"] == 1
        # the backend itself is up: its connection works, and so do its other models
        assert state["state"] == "up" and state["up"] is True and state["ejections"] == 0
        assert backend_up(gw.port) == {"a": 1.0, "b": 1.0}


def test_connection_failures_eject_the_whole_backend_for_every_model(tmp_path):
    eject_for = 3.0
    later = FaultyUpstream()
    refused = FaultServer(later.handler)  # its port: nothing listens there until start()
    started = False
    try:
        with (
            upstreams(FaultyUpstream()) as (b,),
            gateway_process(
                tmp_path, config([refused, b], "retries = 0", f"eject_for_s = {eject_for}")
            ) as gw,
        ):
            client = client_for(gw.port)
            for model in "ABCDE":  # a different model each time: the backend is what fails
                assert complete(client, model) == expected_text(8)
            state = backends_ready(gw.port)["a"]
            assert state["state"] == "ejected" and state["up"] is False, state
            assert state["ejections"] == 1 and state["models"] == {}
            assert backend_up(gw.port) == {"a": 0.0, "b": 1.0}
            # a listens now; while ejected it gets nothing, for any model
            refused.start()
            started = True
            for model in "ABCDEF":
                assert complete(client, model) == expected_text(8)
            assert refused.requests == []
            assert len(b.requests) == 11
            # after the cool-down the next request is the probe, and it restores a
            wait_until(
                lambda: backends_ready(gw.port)["a"]["state"] == "probe_due",
                eject_for * 10,
                "the cool-down ends",
            )
            assert complete(client, "Z") == expected_text(8)
            assert models_seen(refused) == ["Z"]
            assert backends_ready(gw.port)["a"]["state"] == "up"
            assert backend_up(gw.port) == {"a": 1.0, "b": 1.0}
    finally:
        if started:
            refused.stop()


def test_an_ejected_model_is_probed_after_its_cool_down_and_one_probe_restores_it(tmp_path):
    flaky, steady = FaultyUpstream(default="status=503"), FaultyUpstream()
    with (
        upstreams(flaky, steady) as (a, b),
        gateway_process(tmp_path, config([a, b], "retries = 0")) as gw,
    ):
        for _ in range(5):
            answer = chat(gw.port)  # model "m"
            assert answer.status == 200, answer  # b answered every one
            assert backend_up(gw.port)["a"] == 1.0  # an answer's failure: the backend is up
        assert (len(a.requests), len(b.requests)) == (5, 5)
        state = backends_ready(gw.port)
        assert state["a"]["models"] == {"m": "ejected"} and state["a"]["model_ejections"] == 1
        assert state["a"]["state"] == "up" and state["b"]["models"] == {}

        # ejected for m: skipped, even by requests that arrive together
        answers = asyncio.run(storm(gw.port, clients=20))
        assert [x.status for x in answers] == [200] * 20
        assert (len(a.requests), len(b.requests)) == (5, 25)

        # a recovers; after the cool-down the next request is the probe, and it restores m on a
        flaky.default = ""
        wait_until(
            lambda: backends_ready(gw.port)["a"]["models"] == {"m": "probe_due"},
            EJECT_FOR_S * 10,
            "the cool-down ends",
        )
        probe = chat(gw.port)
        assert probe.status == 200 and content_of(probe) == expected_text(8)
        assert (len(a.requests), len(b.requests)) == (6, 25)
        state = backends_ready(gw.port)
        assert state["a"]["models"] == {} and state["a"]["model_ejections"] == 1
        for _ in range(5):
            assert chat(gw.port).status == 200
        assert (len(a.requests), len(b.requests)) == (11, 25)  # ordered: a first again


def test_a_failed_probe_ejects_again_and_only_the_probe_reaches_the_backend(tmp_path):
    flaky, steady = FaultyUpstream(default="status=503"), FaultyUpstream()
    with (
        upstreams(flaky, steady) as (a, b),
        gateway_process(tmp_path, config([a, b], "retries = 0")) as gw,
    ):
        for _ in range(5):
            assert chat(gw.port).status == 200
        assert backends_ready(gw.port)["a"]["models"] == {"m": "ejected"}
        wait_until(
            lambda: backends_ready(gw.port)["a"]["models"] == {"m": "probe_due"},
            EJECT_FOR_S * 10,
            "the cool-down ends",
        )
        # many requests at once when the probe is due: one of them is the probe, the rest
        # go to b; the probe fails (a still answers 503) and b answers it too
        answers = asyncio.run(storm(gw.port, clients=20))
        assert [x.status for x in answers] == [200] * 20
        assert len(a.requests) == 6
        assert len(b.requests) == 25
        state = backends_ready(gw.port)["a"]
        assert state["models"] == {"m": "ejected"} and state["model_ejections"] == 2
        assert backend_up(gw.port)["a"] == 1.0


def failing_first(n: int) -> FaultyUpstream:
    """An upstream whose first ``n`` answers are 503, and every later one 200."""
    behaviour = FaultyUpstream(default="status=503")
    clean = behaviour.handler
    count = 0

    async def handler(req: Any, writer: Any) -> bool:
        nonlocal count
        count += 1
        behaviour.default = "status=503" if count <= n else ""
        return await clean(req, writer)

    behaviour.handler = handler  # type: ignore[method-assign]
    return behaviour


def test_the_failure_that_ejects_a_model_is_not_retried_there(tmp_path):
    # a answers 503 five times, then 200. retries = 1: requests 1 and 2 each try a twice and
    # fall back to b; request 3's first attempt is a's fifth failure for m, which ejects m
    # there — its retry must go to b, not to a (a retry there would be a trial whose 200 puts
    # m straight back into rotation, and the ejection would last one request)
    flaky, steady = failing_first(5), FaultyUpstream()
    with (
        upstreams(flaky, steady) as (a, b),
        gateway_process(tmp_path, config([a, b], "retries = 1", "eject_for_s = 60")) as gw,
    ):
        for _ in range(3):
            answer = chat(gw.port)
            assert answer.status == 200 and content_of(answer) == expected_text(8)
        assert (len(a.requests), len(b.requests)) == (5, 3)
        state = backends_ready(gw.port)["a"]
        assert state["models"] == {"m": "ejected"} and state["model_ejections"] == 1, state


@pytest.mark.parametrize("kind", ["answer", "connection"])
@pytest.mark.parametrize("strategy", ["ordered", "weighted", "least_outstanding"])
def test_every_strategy_skips_an_ejected_backend_or_model(tmp_path, strategy, kind):
    route = f'strategy = "{strategy}"\nretries = 0\n'
    if strategy == "weighted":
        route += "weights = [3, 1]\n"
    backend_extra = "eject_for_s = 60"  # no probe while the test runs
    # "answer": a answers 503 (m is ejected there); "connection": a refuses (a is ejected)
    flaky = FaultyUpstream(default="status=503" if kind == "answer" else "")
    a = FaultServer(flaky.handler)
    if kind == "answer":
        a.start()
    try:
        with (
            upstreams(FaultyUpstream()) as (b,),
            gateway_process(tmp_path, config([a, b], route, backend_extra)) as gw,
        ):

            def ejected() -> bool:
                state = backends_ready(gw.port)["a"]
                return bool(state["models"] == {"m": "ejected"} or state["state"] == "ejected")

            # until a's fifth failure some requests try it first (then fall back to b)
            for _ in range(100):
                assert chat(gw.port).status == 200
                if ejected():
                    break
            if kind == "connection":
                assert backend_up(gw.port)["a"] == 0.0
                a.start()  # it would answer now, were it asked
            assert len(a.requests) == (5 if kind == "answer" else 0)
            before = len(b.requests)
            answers = asyncio.run(storm(gw.port, clients=10, each=4))
            assert [x.status for x in answers] == [200] * 40
            assert len(a.requests) == (5 if kind == "answer" else 0)
            assert len(b.requests) == before + 40
    finally:
        if a.thread.is_alive():
            a.stop()


# ---------------------------------------------------------------- backoff (docs/spec.md §6)


def busy_first(retry_after: str | None) -> FaultyUpstream:
    """An upstream whose first answer is 503 (with ``Retry-After`` when given), then 200."""
    behaviour = FaultyUpstream()
    clean = behaviour.handler
    count = 0

    async def handler(req: Any, writer: Any) -> bool:
        nonlocal count
        count += 1
        if count > 1:
            return await clean(req, writer)
        extra = [("retry-after", retry_after)] if retry_after is not None else None
        writer.write(http_response(503, b'{"error": {"message": "busy"}}', extra=extra))
        return True

    behaviour.handler = handler  # type: ignore[method-assign]
    return behaviour


def server_timing(header: str) -> dict[str, float]:
    """``name;dur=ms`` entries of a Server-Timing header, in seconds (those with a dur)."""
    out = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        if params.startswith("dur="):
            out[name] = float(params[4:]) / 1000
    return out


@pytest.mark.parametrize("retry_after", [None, "0.1"], ids=["backoff", "retry-after"])
def test_the_wait_before_a_retry_is_backoff_not_gateway_time(tmp_path, retry_after):
    with (
        upstreams(busy_first(retry_after)) as (a,),
        gateway_process(tmp_path, config([a], "retries = 1")) as gw,
    ):
        client = client_for(gw.port)
        started = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        elapsed = time.perf_counter() - started
        assert raw.status_code == 200 and len(a.requests) == 2
        timing = server_timing(raw.headers["server-timing"])
        assert timing["backoff"] > 0
        if retry_after is not None:  # honoured: what the upstream asked for (the event loop's
            # timer may fire up to a millisecond early: uvloop rounds timers to its ms clock)
            assert timing["backoff"] >= 0.098
        # the request's time is upstream + backoff + the gateway's own, each counted once
        parts = timing["upstream"] + timing["backoff"] + timing["gateway"]
        assert parts <= elapsed + 0.001  # (each rounded to the µs)


# ---------------------------------------------------------------- the retry budget


def budget_bound(first_attempts: int, elapsed_s: float) -> int:
    """The most retries the budget lets through: 20 % of the requests in the window, plus the
    floor in every second the storm touched (an interval of L s touches ceil(L) + 1 seconds)."""
    return math.floor(BUDGET_RATIO * first_attempts) + BUDGET_FLOOR_PER_S * (
        math.ceil(elapsed_s) + 1
    )


def test_the_retry_budget_stops_a_retry_storm(tmp_path):
    # never ejected (eject_after = 0): the budget alone has to stop the storm; retries = 2
    # would be 100 retries for 50 requests without it
    always_503 = FaultyUpstream(default="status=503")
    with (
        upstreams(always_503) as (a,),
        gateway_process(tmp_path, config([a], "retries = 2", "eject_after = 0")) as gw,
    ):
        started = time.monotonic()
        answers = asyncio.run(storm(gw.port, clients=50))
        elapsed = time.monotonic() - started
        # every client got the backend's answer, passed through
        assert [x.status for x in answers] == [503] * 50
        assert all(json.loads(x.body)["error"]["message"] == "injected" for x in answers)
        retries = len(a.requests) - 50
        state = backends_ready(gw.port)["a"]
        assert state["retries"] == retries  # what the gateway counted is what the backend saw
        assert state["budget_exhausted"] > 0
        assert state["ejections"] == 0
        assert 0 < retries <= budget_bound(50, elapsed), (retries, elapsed)


def test_when_the_budget_is_spent_requests_fall_back_to_the_next_backend(tmp_path):
    always_503, steady = FaultyUpstream(default="status=503"), FaultyUpstream()
    with (
        upstreams(always_503, steady) as (a, b),
        gateway_process(tmp_path, config([a, b], "retries = 2", "eject_after = 0")) as gw,
    ):
        started = time.monotonic()
        answers = asyncio.run(storm(gw.port, clients=50))
        elapsed = time.monotonic() - started
        assert [x.status for x in answers] == [200] * 50
        assert all(content_of(x) == expected_text(8) for x in answers)
        assert len(b.requests) == 50  # a fallback is not a retry: b took every request
        retries = len(a.requests) - 50
        assert 0 < retries <= budget_bound(50, elapsed), (retries, elapsed)
        assert backends_ready(gw.port)["a"]["budget_exhausted"] > 0


# ---------------------------------------------------------------- load balancing


def test_weighted_3_to_1_splits_within_tolerance(tmp_path):
    with (
        upstreams(FaultyUpstream(), FaultyUpstream()) as (a, b),
        gateway_process(
            tmp_path, config([a, b], 'strategy = "weighted"\nweights = [3, 1]\n')
        ) as gw,
    ):
        answers = asyncio.run(storm(gw.port, clients=10, each=40))
        assert [x.status for x in answers] == [200] * 400
        assert len(a.requests) + len(b.requests) == 400
        share = len(a.requests) / 400
        assert abs(share - 0.75) <= 0.03, (len(a.requests), len(b.requests))


def test_least_outstanding_prefers_the_fast_backend(tmp_path):
    # a holds every answer ~300 ms, b answers at once; 8 clients keep requests in flight
    slow, fast = FaultyUpstream(default="latency=300"), FaultyUpstream()
    with (
        upstreams(slow, fast) as (a, b),
        gateway_process(tmp_path, config([a, b], 'strategy = "least_outstanding"\n')) as gw,
    ):
        answers = asyncio.run(storm(gw.port, clients=8, each=25))
        assert [x.status for x in answers] == [200] * 200
        assert len(a.requests) + len(b.requests) == 200
        # ordered would send all 200 to a, an even split 100; the in-flight count keeps
        # most of them off the slow one
        assert len(b.requests) >= 0.8 * 200, (len(a.requests), len(b.requests))
