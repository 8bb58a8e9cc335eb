"""The live view's ring buffer (gateway/live/recent.py): records, waterfall, feed."""

from __future__ import annotations

import asyncio
import gc
import itertools
import weakref

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import BackendConfig, RouteConfig
from gateway.context import Attempt, Call, RequestContext, Timeline
from gateway.errors import UpstreamError
from gateway.live.recent import RecentRequests, format_record, percentiles, snapshot, stats
from gateway.routes import Backend, Route
from gateway.telemetry.content import ContentPolicy
from gateway.telemetry.server_timing import edge_intervals

BACKEND = Backend(BackendConfig(name="b", url="http://127.0.0.1:9/v1"), None)
T0 = 1000.0  # perf_counter seconds of `received` in these tests
WALL = 1_700_000_000.0  # epoch seconds of `received`


def context(
    *,
    intake: float = 0.0005,
    auth: float | None = 0.001,
    routed: float | None = 0.003,
    attempts: tuple | list = (),
    done: float = 0.050,
    edges: tuple | list = (),
    prompt: str = "hello",
) -> RequestContext:
    """A finished request's context with its points at T0 + the offsets given (seconds)."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [],
        "query_string": b"",
        "client": ("127.0.0.1", 5000),
    }
    t = Timeline()
    t.received, t.wall_ns = T0, int(WALL * 1e9)
    t.intake_done = T0 + intake
    t.auth_done = T0 + auth if auth is not None else None
    t.routed = T0 + routed if routed is not None else None
    t.done = T0 + done
    ctx = RequestContext(scope, t)
    ctx.request_id = "req-1"
    ctx.model = "m"
    payload = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    route = Route(RouteConfig(name="r", models=("*",), backends=("b",)), (BACKEND,))
    ctx.call = Call(ctx.path, "chat", orjson.dumps(payload), payload, False, route)
    for i, (start, first_byte, end) in enumerate(attempts, 1):
        a = Attempt(BACKEND, i, 0)
        a.start = T0 + start
        a.first_byte = T0 + first_byte if first_byte is not None else None
        a.end = T0 + end if end is not None else None
        a.status = 200
        ctx.attempts.append(a)
    ctx.edge_times = [(name, i, WALL - ago) for i, (name, ago) in enumerate(edges, 1)]
    ctx.answer.status = 200
    return ctx


def record(ctx: RequestContext, capture: ContentPolicy | None = None) -> dict:
    return format_record(snapshot(ctx, edge_intervals(ctx), 1, capture))


def names(rec: dict) -> list[str]:
    return [h["name"] for h in rec["hops"]]


def assert_tiles(rec: dict) -> None:
    hops = rec["hops"]
    assert hops[0]["start_ms"] == 0
    for a, b in itertools.pairwise(hops):
        assert b["start_ms"] == pytest.approx(a["start_ms"] + a["dur_ms"], abs=0.0011), (a, b)
    assert all(h["dur_ms"] >= 0 for h in hops), hops
    assert sum(h["dur_ms"] for h in hops) == pytest.approx(rec["total_ms"], abs=0.001 * len(hops))
    gateway = [h["dur_ms"] for h in hops if h["kind"] != "edge"]
    assert sum(gateway) == pytest.approx(rec["request_ms"], abs=0.001 * len(hops))


def test_a_json_request_tiles_intake_auth_router_upstream_relay():
    rec = record(context(attempts=[(0.004, 0.030, 0.040)]))
    assert names(rec) == ["intake", "auth", "router", "gateway", "upstream", "relay"]
    # auth is measured from intake_done (the request handed to the app), not from received
    assert [h["dur_ms"] for h in rec["hops"]] == [0.5, 0.5, 2.0, 1.0, 36.0, 10.0]
    up = rec["hops"][4]
    assert (up["backend"], up["attempt"], up["status"], up["first_byte_ms"]) == ("b", 1, 200, 30.0)
    assert (rec["request_ms"], rec["upstream_ms"], rec["overhead_ms"]) == (50.0, 36.0, 14.0)
    assert rec["backend"] == "b" and rec["route"] == "r" and rec["model"] == "m"
    assert_tiles(rec)


RETRIED = [(0.004, 0.005, 0.006), (0.010, 0.011, 0.012), (0.020, 0.021, 0.045)]


def test_retries_show_their_backoff_and_edge_hops_come_first():
    ctx = context(attempts=RETRIED, edges=[("cdn", 0.030), ("lb", 0.010)])
    ctx.attempts[0].status = 503
    ctx.attempts[1].error = UpstreamError("reset", code="upstream_reset")
    ctx.timeline.backoff = 0.009  # waited 9 ms in all, in gaps of 4 and 8 ms
    rec = record(ctx)
    assert names(rec) == [
        "cdn",
        "lb",
        "intake",
        "auth",
        "router",
        "gateway",
        "upstream",
        "gateway",
        "backoff",
        "upstream",
        "gateway",
        "backoff",
        "upstream",
        "relay",
    ]
    assert rec["edge_ms"] == 30.0 and rec["total_ms"] == 80.0
    assert [h["dur_ms"] for h in rec["hops"][:2]] == [20.0, 10.0]
    # the wait ends each gap (it comes right before the next attempt), its total shared
    backoff = [h for h in rec["hops"] if h["kind"] == "backoff"]
    assert [(h["start_ms"], h["dur_ms"]) for h in backoff] == [(37.0, 3.0), (44.0, 6.0)]
    assert [a["error"] for a in rec["attempts"]] == [
        None,
        {"type": "upstream_reset", "message": "reset"},
        None,
    ]
    assert rec["upstream_ms"] == 2.0 + 2.0 + 25.0
    assert rec["backoff_ms"] == 9.0
    # overhead = request - upstream - backoff (docs/spec.md §6)
    assert rec["overhead_ms"] == 50.0 - 29.0 - 9.0
    assert_tiles(rec)


def test_without_a_wait_the_gap_between_attempts_is_the_gateways():
    rec = record(context(attempts=RETRIED))
    assert "backoff" not in names(rec)
    assert [h["kind"] for h in rec["hops"] if h["start_ms"] in (6.0, 12.0)] == ["gap", "gap"]
    assert rec["backoff_ms"] == 0.0 and rec["overhead_ms"] == 50.0 - 29.0
    assert_tiles(rec)


def test_a_cache_hit_replays_and_the_store_is_a_detail():
    ctx = context()
    ctx.cache.result = "hit"
    ctx.cache.lookup_start, ctx.cache.lookup_end = T0 + 0.002, T0 + 0.0025
    rec = record(ctx)
    assert names(rec) == ["intake", "auth", "router", "replay"]
    assert rec["details"] == [
        {
            "name": "cache lookup",
            "kind": "cache",
            "start_ms": 2.0,
            "dur_ms": 0.5,
            "parent": "router",
            "result": "hit",
            "error": False,
        }
    ]
    assert rec["cache"] == "hit" and rec["upstream_ms"] == 0.0
    assert_tiles(rec)


def test_refused_early_the_hops_end_where_the_request_did():
    assert names(record(context(auth=None, routed=None))) == ["intake", "auth"]
    rec = record(context(routed=None))
    assert names(rec) == ["intake", "auth", "router"] and rec["hops"][2]["dur_ms"] == 49.0


def test_an_attempt_ending_after_done_is_cut_at_done():
    rec = record(context(attempts=[(0.004, 0.010, 0.060)]))
    assert names(rec) == ["intake", "auth", "router", "gateway", "upstream"]
    assert_tiles(rec)


_offset = st.floats(min_value=0.0, max_value=0.2, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    intake=_offset,
    backoff=_offset,
    auth=st.none() | _offset,
    routed=st.none() | _offset,
    attempts=st.lists(st.tuples(_offset, st.none() | _offset, st.none() | _offset), max_size=4),
    done=_offset,
    edges=st.lists(st.floats(min_value=-2.0, max_value=70.0, allow_nan=False), max_size=3),
)
def test_the_waterfall_always_tiles_the_request(
    intake, backoff, auth, routed, attempts, done, edges
):
    # points in any order (skewed proxies, attempts cut at done, unreached points), any wait:
    # the bars still follow each other, never negative, and add up to the request
    ctx = context(
        intake=intake,
        auth=auth,
        routed=routed,
        attempts=attempts,
        done=done,
        edges=[(f"e{i}", ago) for i, ago in enumerate(sorted(edges, reverse=True))],
    )
    ctx.timeline.backoff = backoff
    rec = record(ctx)
    assert_tiles(rec)
    drawn = sum(h["dur_ms"] for h in rec["hops"] if h["kind"] == "backoff")
    assert drawn <= rec["backoff_ms"] + 0.001 * len(rec["hops"])


def test_the_buffer_is_bounded_newest_first_and_keeps_no_request_alive():
    recent = RecentRequests(3)
    ctxs = [context() for _ in range(5)]
    for i, ctx in enumerate(ctxs):
        ctx.request_id = f"r{i}"
        recent(ctx, edge_intervals(ctx))
    assert [r["id"] for r in recent.records()] == ["r4", "r3", "r2"]
    assert [r["seq"] for r in recent.records(after=3)] == [5, 4]
    assert len(recent) == 3 and recent.last_seq == 5
    # only numbers are kept: the context (its body, payload, headers) can go
    ref = weakref.ref(ctxs[-1])
    del ctx, ctxs
    gc.collect()
    assert ref() is None


def test_prompts_and_completions_only_with_capture_content():
    ctx = context(prompt="the secret prompt")
    ctx.answer.captured = ["the secret ", "answer"]
    plain = record(ctx)
    assert "input" not in plain and "output" not in plain
    assert b"secret" not in orjson.dumps(plain)
    captured = record(ctx, capture=ContentPolicy("full"))
    assert "the secret prompt" in captured["input"]
    assert captured["output"] == "the secret answer"


def test_the_live_view_shows_content_redacted():
    ctx = context(prompt="my key is sk-abc123 and more")
    ctx.answer.captured = ["your key sk-", "zz9 is safe"]
    policy = ContentPolicy("full", redact=[r"sk-[a-z0-9]+"])
    captured = record(ctx, capture=policy)
    assert "sk-abc123" not in captured["input"] and "[REDACTED]" in captured["input"]
    assert captured["output"] == "your key [REDACTED] is safe"  # matched across two pieces


def session_facts(**kw: object) -> dict:
    """What a realtime session sets on its context at its end (gateway/context.py)."""
    response = {
        "id": "resp_1",
        "status": "completed",
        "ttft_ms": 12.5,
        "duration_ms": 40.0,
        "input_tokens": 3,
        "cached_tokens": 0,
        "output_tokens": 7,
        "cost_usd": 0.0001,
    }
    facts = {
        "messages_in": 3,
        "messages_out": 12,
        "close_code": 1000,
        "closed_by": "client",
        "close_reason": "",
        "responses_total": 1,
        "responses": [response],
    }
    return {**facts, **kw}


def test_a_realtime_session_carries_its_facts_and_a_request_has_no_such_key():
    plain = record(context())
    assert "realtime" not in plain
    ctx = context(attempts=[(0.004, 0.010, 0.050)], done=0.050)
    ctx.path, ctx.method = "/v1/realtime", "GET"
    ctx.answer.status = 101
    facts = session_facts()
    ctx.realtime = facts
    recent = RecentRequests(10)
    recent(ctx, [])
    (rec,) = recent.records()
    assert rec["realtime"] == facts and rec["status"] == 101
    assert rec["realtime"] is not facts  # the record is the view's own copy...
    assert rec["realtime"]["responses"][0] is not facts["responses"][0]
    assert set(rec) == set(plain) | {"realtime"}  # ...and otherwise a request's record
    assert_tiles(rec)
    assert orjson.loads(orjson.dumps(rec))["realtime"]["responses"][0]["ttft_ms"] == 12.5


def test_sessions_stay_out_of_the_latency_percentiles():
    recent = RecentRequests(10)
    recent(context(done=0.020), [])
    session = context(done=3600.0)  # an hour open
    session.realtime = session_facts()
    recent(session, [])
    records = recent.records()
    assert len(records) == 2
    got = stats(records)
    assert got["request_ms"]["count"] == 1 and got["request_ms"]["p99"] == 20.0


def test_a_watcher_gets_the_backlog_then_live_records_and_a_slow_one_is_dropped():
    async def main() -> None:
        recent = RecentRequests(10)
        for _ in range(3):
            recent(context(), [])
        w = recent.watch(after=1, size=4)
        assert [w.queue.get_nowait()[0] for _ in range(2)] == [2, 3]  # oldest first
        recent(context(), [])
        seq, data = w.queue.get_nowait()
        assert seq == 4 and orjson.loads(data)["seq"] == 4
        for _ in range(5):  # nobody reads: the queue (4) overflows
            recent(context(), [])
        assert w.dropped and recent.dropped_watchers == 1
        items = [w.queue.get_nowait() for _ in range(w.queue.qsize())]
        assert items[-1] is None  # the reader is told to stop
        recent(context(), [])  # a dropped watcher costs nothing more
        assert w.queue.qsize() == 0

    asyncio.run(main())


def test_percentiles_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == {"count": 100, "p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert percentiles([7.0])["p99"] == 7.0
