"""The common request's fast paths write what the general ones do: the framed span
tree of :func:`~gateway.telemetry.spans.framed.build_framed` is byte for byte
``frame_spans(build_spans(...))`` with the same ids, and the metrics' per-label-tuple rows
(:class:`~gateway.telemetry.metrics.recorder._Plan`) count what the general path counts."""

from __future__ import annotations

import asyncio
import importlib
import marshal
import random
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from gateway.app import Gateway
from gateway.config import load_config
from gateway.context import RequestContext
from gateway.telemetry import otlp
from gateway.telemetry.metrics import recorder as metrics_module
from gateway.telemetry.spans import builders, framed, tree
from gateway.telemetry.spans import record as span_record
from gateway.telemetry.tracing import Tracing

BASE = """
[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
name = "default"
models = ["gpt-4o-mini", "gpt-4o*"]
backends = ["mock"]

[tracing]
exporter = "otlp"
endpoint = "http://127.0.0.1:9"
sample_ratio = 1.0
shutdown_timeout_s = 0.1

[logging]
access_log = "off"

[ui]
enabled = false
"""
AUTH = """
[auth]
mode = "keys"
[[auth.keys]]
tenant = "t1"
sha256 = "f3abf2a6cc4f00987743db5f544ba345b4899ae31f326d8ee9c4816de153c9e0"  # sk-test
"""
PRICES = '[[prices]]\nmodels = ["gpt-4o*"]\ninput = 0.15\noutput = 0.60\n'
MEMORY_CACHE = '[cache]\nbackend = "memory"\nmode = "all"\n'
NO_CACHE = '[cache]\nbackend = "off"\n'


def body(n: int, **extra: Any) -> bytes:
    payload = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"hi {n}"}]}
    return orjson.dumps({**payload, **extra})


BODIES = [
    body(1),
    body(1),  # a cache hit where the cache is on
    body(2, stream=True),
    body(3, max_tokens=8, temperature=0),
    body(4, model="gpt-4o-2024-08-06", max_completion_tokens=5, temperature=0.5),
    body(5, model="unknown-model"),
    body(6, user="u" * 200),  # the body size's varint: 1 byte above, 2 here
    body(7, user="u" * 20000),  # 3 bytes
    b"{not json",
    # cache hits where the cache is on (no attempt: the common tree without a CLIENT span)
    body(2, stream=True),
    body(3, max_tokens=8, temperature=0),
    body(4, model="gpt-4o-2024-08-06", max_completion_tokens=5, temperature=0.5),
    body(7, user="u" * 20000),
]


async def _drive(toml: str, bodies: list[bytes]) -> dict[str, Any]:
    app = Gateway(load_config(text=toml, env={}))
    async with app.running():
        for data in bodies:
            sent = False

            async def receive(data: bytes = data) -> dict[str, Any]:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": data, "more_body": False}
                await asyncio.Event().wait()
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                pass

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": "/v1/chat/completions",
                "raw_path": b"/v1/chat/completions",
                "query_string": b"",
                "headers": [
                    (b"host", b"gw"),
                    (b"content-type", b"application/json"),
                    (b"authorization", b"Bearer sk-test"),
                ],
                "client": ("127.0.0.1", 40000),
                "server": ("127.0.0.1", 8080),
                "state": {},
            }
            sent = False
            await app(scope, receive, send)
        runtime = app.runtime
        assert runtime is not None and runtime.telemetry.metrics is not None
        return runtime.telemetry.metrics.snapshot()


CONFIGS = {
    "cache-off": BASE + NO_CACHE,
    "memory-cache": BASE + MEMORY_CACHE,
    "prices": BASE + NO_CACHE + PRICES,
    "auth": BASE + NO_CACHE + PRICES + AUTH,
    "memory-cache-auth": BASE + MEMORY_CACHE + PRICES + AUTH,
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_framed_tree_is_the_general_builders_bytes(name, monkeypatch):
    finished: list[tuple[Tracing, RequestContext, list[Any]]] = []
    finish = Tracing.finish

    def capture(self: Tracing, ctx: RequestContext, edge_hops: list[Any]) -> None:
        finished.append((self, ctx, edge_hops))
        finish(self, ctx, edge_hops)

    monkeypatch.setattr(Tracing, "finish", capture)
    asyncio.run(_drive(CONFIGS[name], BODIES))
    assert finished
    general_calls = 0
    general_hits = 0
    build_spans = builders.build_spans

    def counted(ctx: RequestContext, *args: Any, **kwargs: Any) -> list[bytes]:
        nonlocal general_calls, general_hits
        general_calls += 1
        general_hits += ctx.cache.result == "hit"
        return build_spans(ctx, *args, **kwargs)

    for tracing, ctx, edge_hops in finished:
        trace = ctx.trace
        assert trace is not None
        args = (ctx, trace, edge_hops, tracing.edge_hop_count)
        kwargs = {"cache_backend": tracing.cache_backend, "auth_mode": tracing.auth_mode}
        random.seed(7)
        monkeypatch.setattr(framed, "build_spans", counted)
        written = framed.build_framed(*args, **kwargs)
        monkeypatch.setattr(framed, "build_spans", build_spans)
        random.seed(7)
        general = build_spans(*args, **kwargs)
        assert written == (otlp.frame_spans(general), len(general))
    assert general_calls < len(finished) - 2  # most requests took the common tree
    assert general_hits == 0  # and every cache hit did
    hits = sum(ctx.cache.result == "hit" for _, ctx, _ in finished)
    assert hits == (5 if "cache" in name and "off" not in name else 0)


def _comparable(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Counters as they are; of each histogram series its count and whether it has exemplars
    (sums, buckets and exemplar values are times, which differ from run to run)."""
    snapshot = dict(snapshot)
    snapshot.pop("pid")
    snapshot["histograms"] = {
        name: [[labels, sum(row[:-1]), bool(exemplars)] for labels, row, exemplars in series]
        for name, series in snapshot["histograms"].items()
    }
    return snapshot


@pytest.mark.parametrize("name", list(CONFIGS))
def test_metric_rows_count_what_the_general_path_counts(name, monkeypatch):
    record = metrics_module._record
    general_hits = 0

    def counted(m: metrics_module.Metrics, ctx: RequestContext, edges: list[Any]) -> None:
        nonlocal general_hits
        general_hits += ctx.cache.result == "hit"
        record(m, ctx, edges)

    monkeypatch.setattr(metrics_module, "_record", counted)
    fast = asyncio.run(_drive(CONFIGS[name], BODIES))
    assert general_hits == 0  # cache hits took the rows too
    monkeypatch.setattr(metrics_module, "_record", record)

    def general(self: metrics_module.Metrics, ctx: RequestContext, edges: list[Any]) -> None:
        self.inflight.pop(id(ctx), None)
        metrics_module._record(self, ctx, edges)

    monkeypatch.setattr(metrics_module.Metrics, "__call__", general)
    slow = asyncio.run(_drive(CONFIGS[name], BODIES))
    assert _comparable(fast) == _comparable(slow)
    assert fast["counters"]["gateway_requests"]  # something was counted


def test_cache_spans_are_the_general_builders_bytes(monkeypatch):
    """The memoised cache span packs (lookup and store) against :func:`builders._cache_span`: the
    redis backend's extra attribute, a cache error, no entry size, entry sizes of 1..3 varint
    bytes, a lookup without a store."""
    finished: list[tuple[Tracing, RequestContext]] = []
    finish = Tracing.finish

    def capture(self: Tracing, ctx: RequestContext, edge_hops: list[Any]) -> None:
        finished.append((self, ctx))
        finish(self, ctx, edge_hops)

    monkeypatch.setattr(Tracing, "finish", capture)
    asyncio.run(_drive(CONFIGS["memory-cache"], BODIES))
    stored = [ctx for _, ctx in finished if ctx.cache.store_start is not None]
    assert stored
    ctx = stored[0]
    trace = ctx.trace
    assert trace is not None
    outcome = ctx.cache
    cases = 0
    for backend in ("memory", "redis"):
        for error in (False, True):
            for size in (None, 5, 300, 70000):
                for store in (True, False):
                    outcome.error, outcome.stored = error, size
                    store_start = outcome.store_start
                    if not store:
                        outcome.store_start = None
                    common = tree._Tree(ctx, trace)
                    out: list[bytes] = []
                    count = framed._cache_spans(common, backend, out)
                    expected = [
                        builders._cache_span(
                            common,
                            b"\x22\x08" + common.ids[16:24],
                            "cache lookup",
                            outcome.lookup_start,  # type: ignore[arg-type]
                            outcome.lookup_end or common.done,
                            backend,
                        )
                    ]
                    if store:
                        expected.append(
                            builders._cache_span(
                                common,
                                common.under_root,
                                "cache store",
                                outcome.store_start,  # type: ignore[arg-type]
                                outcome.store_end or common.done,
                                backend,
                            )
                        )
                    outcome.store_start = store_start
                    assert (b"".join(out), count) == (otlp.frame_spans(expected), len(expected))
                    cases += 1
    assert cases == 32


def test_traceparent_formats():
    """The cached ``00-<trace id>-`` prefix gives the W3C format (zero-padded lower-case hex)."""
    from gateway.context import TraceContext

    trace = TraceContext(0xAB, 0x1, None, True, "")
    assert trace.traceparent(0xCD) == f"00-{0xAB:032x}-{0xCD:016x}-01"
    assert TraceContext(1 << 127, 2, None, False, "").traceparent(1 << 63) == (
        f"00-{1 << 127:032x}-{1 << 63:016x}-00"
    )


@pytest.mark.parametrize("name", list(CONFIGS))
def test_server_timing_formats_are_the_general_ones(name, monkeypatch):
    """The one-format ``Server-Timing`` of the common answer and of a cache hit is what the
    general path writes for the same request at the same instant."""
    st = importlib.import_module("gateway.telemetry.server_timing")

    seen: list[RequestContext] = []
    finish = Tracing.finish

    def capture(self: Tracing, ctx: RequestContext, edge_hops: list[Any]) -> None:
        seen.append(ctx)
        finish(self, ctx, edge_hops)

    monkeypatch.setattr(Tracing, "finish", capture)
    asyncio.run(_drive(CONFIGS[name], BODIES))
    assert seen
    for ctx in seen:
        now = ctx.timeline.received + 0.0123
        monkeypatch.setattr(st, "time", SimpleNamespace(perf_counter=lambda now=now: now))
        assert st.server_timing(ctx, []) == st._general(ctx, [], now)
    if "memory-cache" in name:
        assert any(ctx.cache.result == "hit" and not ctx.attempts for ctx in seen)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_record_builds_the_framed_trees_bytes(name, monkeypatch):
    """export_in = "process": the common request's record, marshalled to the exporter process
    and built there, is byte for byte the tree the serving process would have built."""
    finished: list[tuple[Tracing, RequestContext, list[Any]]] = []
    finish = Tracing.finish

    def capture(self: Tracing, ctx: RequestContext, edge_hops: list[Any]) -> None:
        finished.append((self, ctx, edge_hops))
        finish(self, ctx, edge_hops)

    monkeypatch.setattr(Tracing, "finish", capture)
    asyncio.run(_drive(CONFIGS[name], BODIES))
    recorded = 0
    for tracing, ctx, edge_hops in finished:
        trace = ctx.trace
        assert trace is not None
        args = (ctx, trace, edge_hops, tracing.edge_hop_count, tracing.cache_backend)
        rec = span_record.record(*args, tracing.auth_mode, tracing.style)
        random.seed(7)
        written = framed.build_framed(*args, tracing.auth_mode, tracing.style)
        if rec is None:
            continue
        recorded += 1
        random.seed(7)
        built = span_record.build_record(marshal.loads(marshal.dumps(rec)))
        assert built == written
        assert span_record.record_spans(rec) == written[1]
    assert recorded > len(finished) - 3  # the common requests: all but the odd ones
