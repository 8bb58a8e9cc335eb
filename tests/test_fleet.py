"""Fleet-aware routing over real sockets (docs/spec.md §21): the gateway in front of two or
three simulated model servers (:mod:`tests.fleet_support`: the mock with a capacity and a real
queue, whose ``/metrics`` a test forces, breaks or hangs), the official SDKs as clients.

What is checked is where each request went (each server records the calls it served) and what
the gateway says on ``/metrics``. Whenever forced values change, the test first waits until the
gateway's gauges show them (the scrapers run every 50 ms, off the request path), so nothing
here depends on timing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fnmatch
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest

from gateway.config import Config
from tests.fleet_support import ModelServer, gauges, sees, unknown, wait_until
from tests.model_api_support import traced
from tests.otlp_receiver import OTLPReceiver
from tests.realtime.test_handshake import refused, run
from tests.support import GatewayServer, anthropic_client, free_port, gateway_config, openai_client

MESSAGES = [{"role": "user", "content": "hello"}]
NO_CACHE = '[cache]\nbackend = "off"\n'


@contextlib.contextmanager
def servers(*names: str, capacity: int = 2, **knobs: Any) -> Iterator[list[ModelServer]]:
    started: list[ModelServer] = []
    try:
        for name in names:
            started.append(ModelServer(name, capacity=capacity, **knobs).start())
        yield started
    finally:
        for s in reversed(started):
            s.stop()


def config(
    fleet: list[ModelServer],
    route: str = "",
    backend_extra: str = "",
    extra: str = "",
    interval_ms: int = 50,
) -> Config:
    backends = "".join(s.backend_toml(backend_extra, interval_ms) for s in fleet)
    names = ", ".join(f'"{s.name}"' for s in fleet)
    return gateway_config(
        f'{backends}\n[[routes]]\nmodels = ["*"]\nbackends = [{names}]\n{route}\n{NO_CACHE}{extra}'
    )


#: one SDK client per gateway in a test (conftest closes them at its end)
_CLIENTS: dict[int, openai.OpenAI] = {}
_CLAUDES: dict[int, anthropic.Anthropic] = {}


@pytest.fixture(autouse=True)
def _one_client_per_gateway() -> Iterator[None]:
    yield
    _CLIENTS.clear()
    _CLAUDES.clear()


def chat(gw: GatewayServer, n: int, **kw: Any) -> None:
    oai = _CLIENTS.get(gw.port)
    if oai is None:
        oai = _CLIENTS[gw.port] = openai_client(gw.base_url, "x")
    for _ in range(n):
        answer = oai.chat.completions.create(model="m", messages=MESSAGES, **kw)  # type: ignore[call-overload]
        assert answer.choices[0].message.content


def served(fleet: list[ModelServer]) -> dict[str, int]:
    return {s.name: s.count() for s in fleet if s.count()}


def fresh(fleet: list[ModelServer]) -> None:
    for s in fleet:
        s.clear()


# ---------------------------------------------------------------- the gauges


def test_the_model_servers_load_is_re_exported_per_backend(gateway):
    with servers("a", "b", "c") as fleet:
        a, b, c = fleet
        a.force(queue=2, running=3, kv=0.4)
        b.force(queue=6, running=1, kv=0.25, fmt="sglang")
        c.mode = "fail"
        gw = gateway(config(fleet))
        sees(
            gw.url,
            [
                ("queue_depth", "a", 2.0),
                ("running_requests", "a", 3.0),
                ("kv_cache_usage_ratio", "a", 0.4),
                ("saturated", "a", 0.0),
                ("queue_depth", "b", 6.0),
                ("running_requests", "b", 1.0),
                ("kv_cache_usage_ratio", "b", 0.25),
                ("saturated", "b", 1.0),  # queue 6 >= max_queue 5
                ("saturated", "c", 0.0),  # unknown load is never saturated
            ],
        )
        got = gauges(gw.url)
        assert ("gateway_backend_queue_depth", "c") not in got  # unknown: no value at all
        assert ("gateway_backend_metrics_age_seconds", "c") not in got  # never scraped
        assert 0 <= got[("gateway_backend_metrics_age_seconds", "a")] < 5
        b.mode = "hang"  # no answer within the period: unknown at once
        unknown(gw.url, "b")
        assert gauges(gw.url)[("gateway_backend_saturated", "b")] == 0.0
        assert ("gateway_backend_metrics_age_seconds", "b") in gauges(gw.url)


# ---------------------------------------------------------------- least_loaded


def test_least_loaded_follows_the_load_and_flips_when_it_flips(gateway):
    with servers("a", "b") as fleet:
        a, b = fleet
        gw = gateway(config(fleet, 'strategy = "least_loaded"', "max_queue = 100"))
        a.force(queue=0, running=1, kv=0.1)
        b.force(queue=3, running=1, kv=0.1)
        sees(gw.url, [("queue_depth", "a", 0.0), ("queue_depth", "b", 3.0)])
        chat(gw, 10)
        assert served(fleet) == {"a": 10}
        fresh(fleet)
        a.force(queue=4, running=1, kv=0.1)
        b.force(queue=1, running=1, kv=0.6)
        sees(gw.url, [("queue_depth", "a", 4.0), ("queue_depth", "b", 1.0)])
        chat(gw, 10)
        assert served(fleet) == {"b": 10}
        fresh(fleet)
        a.force(queue=1, running=1, kv=0.2)  # same queue: the KV-cache decides
        sees(gw.url, [("queue_depth", "a", 1.0)])
        chat(gw, 10)
        assert served(fleet) == {"a": 10}


def test_a_real_queue_is_seen_and_routed_around(gateway):
    """Requests held on ``a`` (capacity 1) build its queue; the gateway routes around it."""
    with servers("a", "b", capacity=1) as fleet:
        a = fleet[0]
        gw = gateway(config(fleet, 'strategy = "least_loaded"', "max_queue = 2"))

        async def held_on_a() -> None:
            writers = []
            for _ in range(3):  # one runs, two wait: the queue is at max_queue
                _, w = await asyncio.open_connection("127.0.0.1", a.port)
                body = orjson.dumps({"model": "m", "messages": MESSAGES})
                w.write(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\n"
                    b"content-type: application/json\r\nx-mock-latency-ms: 60000\r\n"
                    + b"content-length: %d\r\n\r\n" % len(body)
                    + body
                )
                await w.drain()
                writers.append(w)
            try:
                want = [("queue_depth", "a", 2.0), ("saturated", "a", 1.0)]
                await asyncio.to_thread(sees, gw.url, want)
                a.clear()
                await asyncio.to_thread(chat, gw, 8)
                assert served(fleet) == {"b": 8}
            finally:
                for w in writers:
                    w.close()
                    await w.wait_closed()

        asyncio.run(asyncio.wait_for(held_on_a(), 60))
        sees(gw.url, [("queue_depth", "a", 0.0), ("running_requests", "a", 0.0)])


# ---------------------------------------------------------------- saturation, shedding


@pytest.mark.parametrize(
    "route",
    ['strategy = "ordered"', 'strategy = "weighted"\nweights = [9, 1]'],
    ids=["ordered", "weighted"],
)
def test_a_saturated_backend_is_skipped_under_ordered_and_weighted_too(gateway, route):
    with servers("a", "b") as fleet:
        a, b = fleet
        gw = gateway(config(fleet, route))
        a.force(queue=5, running=2, kv=0.3)  # queue at max_queue
        b.force(queue=4, running=2, kv=0.7)
        sees(gw.url, [("saturated", "a", 1.0), ("saturated", "b", 0.0)])
        chat(gw, 10)
        assert served(fleet) == {"b": 10}
        fresh(fleet)
        a.force(queue=0, running=2, kv=0.85)  # the KV-cache saturates it now
        sees(gw.url, [("queue_depth", "a", 0.0), ("saturated", "a", 1.0)])
        chat(gw, 5)
        assert served(fleet) == {"b": 5}
        fresh(fleet)
        a.force(queue=0, running=1, kv=0.1)  # not saturated: the strategy has it again
        sees(gw.url, [("saturated", "a", 0.0)])
        chat(gw, 10)
        assert served(fleet)["a"] >= 8


def test_all_saturated_goes_to_the_least_loaded_or_is_shed(gateway):
    with servers("a", "b") as fleet:
        a, b = fleet
        a.force(queue=9, running=2, kv=0.9)
        b.force(queue=6, running=2, kv=0.9)
        keep = gateway(config(fleet))
        shed = gateway(config(fleet, "shed_when_saturated = true"))
        for gw in (keep, shed):
            sees(gw.url, [("saturated", "a", 1.0), ("saturated", "b", 1.0)])
        chat(keep, 4)
        assert served(fleet) == {"b": 4}  # the least loaded, though saturated
        fresh(fleet)
        shed_client = openai_client(shed.base_url, "x")
        with pytest.raises(openai.APIStatusError) as err:
            shed_client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        resp = err.value.response
        assert resp.status_code == 503
        assert resp.headers["retry-after"] == "1" and resp.headers["x-should-retry"] == "true"
        assert resp.json()["error"]["code"] == "backend_saturated"
        assert resp.json()["error"]["type"] == "upstream_error"
        assert served(fleet) == {}  # nothing was sent upstream
        b.force(queue=1, running=2, kv=0.5)  # one frees up: served again
        sees(shed.url, [("saturated", "b", 0.0)])
        chat(shed, 3)
        assert served(fleet) == {"b": 3}


# ---------------------------------------------------------------- metrics endpoints that fail


def test_a_failing_metrics_endpoint_never_fails_a_request(gateway):
    with servers("a", "b", "c") as fleet:
        a, b, c = fleet
        a.mode, b.mode, c.mode = "fail", "hang", "garbage"
        gone = free_port()  # a fourth backend whose metrics port refuses connections
        d_toml = (
            f'[[backends]]\nname = "d"\nurl = "{a.url}/v1"\n'
            f'metrics_url = "http://127.0.0.1:{gone}/metrics"\nmetrics_interval_ms = 50\n'
        )
        cfg = gateway_config(
            "".join(s.backend_toml() for s in fleet)
            + d_toml
            + '[[routes]]\nmodels = ["*"]\nbackends = ["a", "b", "c", "d"]\n'
            + 'strategy = "least_loaded"\naffinity = "prefix"\nretries = 0\n'
            + NO_CACHE
        )
        gw = gateway(cfg)
        oai = openai_client(gw.base_url, "x")

        def one(i: int) -> str:
            answer = oai.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"question {i}"}]
            )
            return answer.choices[0].message.content or ""

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(40)))
        assert all(answers) and len(answers) == 40
        assert len(served(fleet)) == 3  # keys spread over all of them, metrics or not
        got = gauges(gw.url)
        for name in "abcd":
            assert ("gateway_backend_queue_depth", name) not in got
            assert got[("gateway_backend_saturated", name)] == 0.0
        assert max(s.scrapes for s in fleet) > 1  # scraped all along


# ---------------------------------------------------------------- affinity


def sessions(n: int) -> list[str]:
    return [f"session-{i:03d}" for i in range(n)]


def where(fleet: list[ModelServer]) -> dict[str, set[str]]:
    """session -> the servers that served it."""
    out: dict[str, set[str]] = {}
    for s in fleet:
        for session in s.sessions():
            if session is not None:
                out.setdefault(session, set()).add(s.name)
    return out


SESSION_CARRIERS: list[tuple[str, Callable[[GatewayServer, str], None]]] = [
    (
        "prompt_cache_key",
        lambda gw, key: chat(gw, 1, prompt_cache_key=key),
    ),
    ("user", lambda gw, key: chat(gw, 1, user=key)),
    (
        "x-session-id",
        lambda gw, key: chat(gw, 1, extra_headers={"x-session-id": key}),
    ),
    (
        "metadata.user_id",
        lambda gw, key: (
            anthropic_client(gw.url, "x")
            .messages.create(
                model="claude-sonnet-4", max_tokens=8, messages=MESSAGES, metadata={"user_id": key}
            )
            .content
        ),
    ),
]


@pytest.mark.parametrize(
    "carrier", [c for _, c in SESSION_CARRIERS], ids=[n for n, _ in SESSION_CARRIERS]
)
def test_session_affinity_holds_while_the_fleet_is_stable_and_spreads(gateway, carrier):
    with servers("a", "b", "c") as fleet:
        gw = gateway(config(fleet, 'strategy = "least_loaded"\naffinity = "session"'))
        wait_until(lambda: all(s.scrapes for s in fleet), what="the first scrapes")
        keys = sessions(24)
        for _ in range(3):
            for key in keys:
                carrier(gw, key)
        placed = where(fleet)
        assert set(placed) == set(keys)
        assert all(len(backends) == 1 for backends in placed.values())  # 100 % hits
        spread = Counter(next(iter(b)) for b in placed.values())
        assert len(spread) == 3 and min(spread.values()) >= 3, spread


def test_a_session_spills_when_its_backend_saturates_and_comes_back(gateway):
    with servers("a", "b", "c") as fleet:
        gw = gateway(config(fleet, 'affinity = "session"'))
        keys = sessions(30)
        for key in keys:
            chat(gw, 1, user=key)
        home = {k: next(iter(v)) for k, v in where(fleet).items()}
        assert len(set(home.values())) == 3  # the keys are spread
        fresh(fleet)
        full = fleet[0]
        full.force(queue=5, running=2, kv=0.5)
        sees(gw.url, [("saturated", full.name, 1.0)])
        for key in keys:
            chat(gw, 1, user=key)
        now = {k: next(iter(v)) for k, v in where(fleet).items()}
        for key in keys:
            if home[key] == full.name:
                assert now[key] != full.name  # spilled
            else:
                assert now[key] == home[key]  # the others did not move
        assert full.name in home.values()
        fresh(fleet)
        full.force(queue=0, running=0, kv=0.0)
        sees(gw.url, [("saturated", full.name, 0.0)])
        for key in keys:
            chat(gw, 1, user=key)
        assert {k: next(iter(v)) for k, v in where(fleet).items()} == home


def test_when_a_backend_leaves_only_its_keys_move(gateway):
    with servers("a", "b", "c") as fleet:
        gw = gateway(config(fleet, 'affinity = "session"', "eject_after = 1\neject_for_s = 60"))
        keys = sessions(40)
        for key in keys:
            chat(gw, 1, user=key)
        home = {k: next(iter(v)) for k, v in where(fleet).items()}
        leaving = fleet[2]
        leaving.stop()  # its port now refuses connections: ejected at the first failure
        stayed = fleet[:2]
        for s in stayed:
            s.clear()
        for key in keys:
            chat(gw, 1, user=key)
        now = {k: next(iter(v)) for k, v in where(stayed).items()}
        assert set(now) == set(keys)
        moved = {k for k in keys if now[k] != home[k]}
        assert moved == {k for k in keys if home[k] == leaving.name}
        assert moved  # it had keys to give up


def test_prefix_affinity_keeps_a_prompt_prefix_on_one_backend(gateway):
    with servers("a", "b", "c") as fleet:
        gw = gateway(config(fleet, 'strategy = "least_loaded"\naffinity = "prefix"'))
        oai = openai_client(gw.base_url, "x")
        systems = [
            f"You are assistant number {i}. " + "Follow the house style. " * 100 for i in range(18)
        ]
        for system in systems:
            for turn in range(3):  # the same opening, a different question each time
                oai.chat.completions.create(
                    model="m",
                    messages=[
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"question {turn}"},
                    ],
                )
        homes: dict[str, set[str]] = {}
        for s in fleet:
            for call in s.served:
                homes.setdefault(call.body["messages"][0]["content"], set()).add(s.name)
        assert len(homes) == 18 and all(len(v) == 1 for v in homes.values())
        assert len({next(iter(v)) for v in homes.values()}) == 3


# ---------------------------------------------------------------- the attempt span


def test_the_attempt_span_carries_the_affinity_and_the_backends_load(gateway):
    with servers("a", "b") as fleet, OTLPReceiver("http") as otlp:
        a, b = fleet
        a.force(queue=3, running=2, kv=0.5)
        b.force(queue=2, running=1, kv=0.25)
        gw = gateway(config(fleet, 'affinity = "session"', extra=traced(otlp.endpoint)))
        sees(gw.url, [("queue_depth", "a", 3.0), ("queue_depth", "b", 2.0)])
        oai = openai_client(gw.base_url, "x")
        oai.chat.completions.create(model="m", messages=MESSAGES, user="dora")
        home = next(s for s in fleet if s.count())
        home.force(queue=5, running=2, kv=0.5)  # saturated: the session spills
        sees(gw.url, [("saturated", home.name, 1.0)])
        oai.chat.completions.create(model="m", messages=MESSAGES, user="dora")
        oai.chat.completions.create(model="m", messages=MESSAGES)  # no session
        spans = otlp.wait_for(lambda got: len([s for s in got if s.kind == "CLIENT"]) >= 3)
        attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
        hit, spill, none = (s.attributes for s in attempts[:3])
        assert hit["gateway.affinity"] == "hit" and hit["gateway.backend"] == home.name
        expected = {"a": (3.0, 0.5), "b": (2.0, 0.25)}
        got = (hit["gateway.backend.queue_depth"], hit["gateway.backend.kv_cache_usage"])
        assert got == expected[home.name]
        assert spill["gateway.affinity"] == "spill" and spill["gateway.backend"] != home.name
        assert none["gateway.affinity"] == "none"


# ---------------------------------------------------------------- the live view


def test_the_live_view_shows_each_backends_queue_and_kv_cache(gateway):
    from tests.live.test_view import chromium

    with servers("a", "b", "c") as fleet:
        a, b, c = fleet
        a.force(queue=2, running=3, kv=0.42)
        b.force(queue=7, running=4, kv=0.9)
        c.mode = "fail"
        # scrapes once a second: a browser starting on a busy machine can hold the test's model
        # servers for longer than the default 50 ms period, and a missed period is (rightly) unknown
        gw = gateway(config(fleet, extra="[ui]\nenabled = true\n", interval_ms=1000))
        sees(gw.url, [("queue_depth", "a", 2.0), ("queue_depth", "b", 7.0)])
        rows = {
            r["name"]: r["load"]
            for r in httpx2.get(gw.url + "/_gateway/api/backends").json()["backends"]
        }
        assert rows["a"]["known"] and (rows["a"]["queue"], rows["a"]["kv_cache"]) == (2.0, 0.42)
        assert rows["b"]["saturated"] is True and rows["c"]["known"] is False
        with chromium() as (page, errors):
            page.goto(gw.url + "/_gateway/")
            cell = page.locator('#backends tr[data-backend="a"] td.load-queue')
            cell.wait_for()
            assert cell.inner_text() == "2 (3 running)"
            assert page.locator('#backends tr[data-backend="a"] td.load-kv').inner_text() == "42 %"
            hot = page.locator('#backends tr[data-backend="b"] td.load-queue')
            assert hot.inner_text() == "7 (4 running) saturated"
            assert "error" in (hot.get_attribute("class") or "")
            gone = page.locator('#backends tr[data-backend="c"] td.load-queue').inner_text()
            assert gone == "unknown"
            assert errors == []


# ---------------------------------------------------------------- the compose stack


def test_the_compose_stack_runs_a_capacity_limited_fleet_behind_least_loaded_and_prefix():
    from pathlib import Path
    from urllib.parse import urlsplit

    import yaml

    from gateway.config import load_config

    deploy = Path(__file__).resolve().parent.parent / "deploy"
    cfg = load_config(deploy / "gateway/gateway.toml", env={})
    services = yaml.safe_load((deploy / "docker-compose.yml").read_text())["services"]
    (fleet,) = [r for r in cfg.routes if r.strategy == "least_loaded"]
    assert fleet.affinity == "prefix" and len(fleet.backends) == 2
    by_name = {b.name: b for b in cfg.backends}
    for name in fleet.backends:
        backend = by_name[name]
        url, metrics = urlsplit(backend.url), urlsplit(backend.metrics_url or "")
        assert (metrics.hostname, metrics.port, metrics.path) == (
            url.hostname,
            url.port,
            "/metrics",
        )
        command = services[url.hostname]["command"]
        assert command[:2] == ["gateway", "mock-upstream"]
        assert int(command[command.index("--capacity") + 1]) >= 1
    load = services["loadgen-fleet"]
    model = load["environment"]["LOCUST_MODEL"]
    first = next(r for r in cfg.routes if any(fnmatch.fnmatchcase(model, p) for p in r.models))
    assert first is fleet and load["profiles"] == ["load"]


def test_the_vllm_fleet_example_is_valid_and_fleet_aware():
    from pathlib import Path

    from gateway.config import load_config

    path = Path(__file__).resolve().parent.parent / "config/examples/vllm-fleet.toml"
    cfg = load_config(path, env={})
    (route,) = cfg.routes
    assert (route.strategy, route.affinity) == ("least_loaded", "prefix")
    assert all(b.metrics_url and b.metrics_url.endswith("/metrics") for b in cfg.backends)
    assert len(cfg.backends) == len(route.backends) >= 2


def test_a_realtime_session_is_shed_like_a_request(gateway):
    """The WebSocket handshake takes the same backend order (docs/spec.md §19, §21): every
    backend saturated on a shedding route is a 503 before any upgrade, nothing sent upstream."""
    with servers("a", "b") as fleet:
        a, b = fleet
        a.force(queue=9, running=2, kv=0.9)
        b.force(queue=6, running=2, kv=0.9)
        shed = gateway(config(fleet, "shed_when_saturated = true"))
        sees(shed.url, [("saturated", "a", 1.0), ("saturated", "b", 1.0)])
        url = f"ws://127.0.0.1:{shed.port}/v1/realtime?model=m"
        status, body, headers = run(refused(url))
        assert status == 503
        assert body["error"]["code"] == "backend_saturated"
        assert headers["retry-after"] == "1"
        assert served(fleet) == {}
