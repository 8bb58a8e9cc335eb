"""SPEC §6/§7 over real sockets: spans exported by the gateway, decoded by a real OTLP receiver."""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time

import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import TracingConfig
from gateway.telemetry.tracing import Tracing, parse_traceparent
from tests.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.support import (
    LAST_CHUNK,
    answering,
    chat_chunk,
    chunk,
    config_for,
    http_response,
    openai_client,
    sse_head,
)

MSG = [{"role": "user", "content": "trace me"}]


def traced(
    upstream_url: str,
    receiver: OTLPReceiver,
    *,
    protocol: str = "http/protobuf",
    edge: str = "",
    extra: str = "",
    backend_extra: str = "",
    route_extra: str = "",
):
    tracing = f"""
[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
protocol = "{protocol}"
sample_ratio = 1.0
schedule_delay_ms = 50
{extra}
"""
    edge = (
        edge
        or """
[edge]
trusted_proxies = ["127.0.0.1/32"]
[[edge.hops]]
name = "cdn"
header = "x-cdn-start"
[[edge.hops]]
name = "lb"
header = "x-request-start"
"""
    )
    return config_for(
        upstream_url, extra=tracing + edge, backend_extra=backend_extra, route_extra=route_extra
    )


def one_trace(receiver: OTLPReceiver, root_name: str, count: int) -> list[ReceivedSpan]:
    spans = receiver.wait_for(
        lambda ss: (
            any(s.name == root_name and s.kind == "SERVER" for s in ss)
            and len(receiver.trace(next(s.trace_id for s in ss if s.name == root_name))) >= count
        )
    )
    root = next(s for s in spans if s.name == root_name and s.kind == "SERVER")
    return receiver.trace(root.trace_id)


def by_name(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans}


def test_span_tree_with_edge_hops(gateway, mock_upstream, receiver):
    gw = gateway(traced(mock_upstream.url + "/v1", receiver))
    client = openai_client(gw.base_url, "sk-x")
    # warm the SDK up (its first call builds its types), so the timed request is quick to send
    client.chat.completions.with_raw_response.create(model="warm-up", messages=MSG)
    receiver.wait_for(lambda ss: any(s.name == "chat warm-up" for s in ss))
    receiver.clear()
    now = time.time()
    cdn_at, lb_at = now - 0.050, now - 0.020
    raw = client.chat.completions.with_raw_response.create(
        model="mock-gpt-4o",
        messages=MSG,
        temperature=0.5,
        max_tokens=7,
        extra_headers={
            "x-cdn-start": f"t={cdn_at:.6f}",  # seconds
            "x-request-start": f"t={int(lb_at * 1000)}",
        },  # milliseconds
    )
    answer = raw.parse()
    spans = one_trace(receiver, "POST /v1/chat/completions", 7)
    names = by_name(spans)
    assert set(names) == {
        "POST /v1/chat/completions",
        "hop cdn",
        "hop lb",
        "hop intake",
        "hop auth",
        "hop router",
        "chat mock-gpt-4o",
    }
    root = names["POST /v1/chat/completions"]
    assert root.kind == "SERVER" and root.parent_span_id is None
    for s in spans:
        if s is not root:
            assert s.parent_span_id == root.span_id, s.name
            assert s.trace_id == root.trace_id
    hops = sorted(
        (s for s in spans if s.name.startswith("hop ")), key=lambda s: s.attributes["hop.index"]
    )
    assert [h.attributes["hop.name"] for h in hops] == ["cdn", "lb", "intake", "auth", "router"]
    assert [h.attributes["hop.index"] for h in hops] == [1, 2, 3, 4, 5]
    sources = [h.attributes["hop.source"] for h in hops]
    assert sources == ["header", "header", "gateway", "gateway", "gateway"]
    assert all(h.kind == "INTERNAL" for h in hops)
    # hops follow each other in time: each starts where the previous ended (or later)
    for a, b in itertools.pairwise(hops):
        assert b.start_ns >= a.end_ns - 1_000, (a.name, b.name)
    # reconstructed edge hops match the injected header times
    assert names["hop cdn"].start_ns == pytest.approx(cdn_at * 1e9, abs=2e6)
    assert names["hop cdn"].duration_ms == pytest.approx(
        (int(lb_at * 1000) / 1000 - cdn_at) * 1000, abs=2.0
    )
    assert names["hop lb"].start_ns == pytest.approx(int(lb_at * 1000) * 1e6, abs=1e3)
    assert 19.0 <= names["hop lb"].duration_ms <= 40.0  # up to when the gateway received it

    a = root.attributes
    for key in (
        "http.request.method",
        "url.path",
        "http.route",
        "http.response.status_code",
        "client.address",
        "gateway.request_time_ms",
        "gateway.upstream_time_ms",
        "gateway.overhead_ms",
        "gateway.cache",
        "gateway.route",
        "gen_ai.request.model",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
    ):
        assert key in a, key
    assert a["http.request.method"] == "POST" and a["http.route"] == "/v1/chat/completions"
    assert a["http.response.status_code"] == 200 and a["client.address"] == "127.0.0.1"
    assert a["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens == 7
    assert a["gateway.request_time_ms"] == pytest.approx(
        a["gateway.upstream_time_ms"] + a["gateway.overhead_ms"], abs=0.01
    )
    assert a["gateway.upstream_time_ms"] > 0 and a["gateway.overhead_ms"] > 0
    assert root.status_code == "UNSET"
    assert root.resource["service.name"] == "llm-gateway"

    c = names["chat mock-gpt-4o"]
    assert c.kind == "CLIENT"
    ca = c.attributes
    assert ca["gen_ai.operation.name"] == "chat"
    assert ca["gen_ai.provider.name"] == "openai"
    assert "gen_ai.system" not in ca  # the pre-1.37 name is not used
    assert ca["gen_ai.request.model"] == "mock-gpt-4o"
    assert ca["gen_ai.request.stream"] is False
    assert ca["gen_ai.request.max_tokens"] == 7
    assert ca["gen_ai.request.temperature"] == 0.5
    assert ca["gen_ai.response.model"] == "mock-gpt-4o"
    assert ca["gen_ai.response.id"] == answer.id
    assert ca["gen_ai.response.finish_reasons"] == ["length"]
    assert ca["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
    assert ca["server.address"] == "127.0.0.1" and ca["server.port"] == mock_upstream.port
    assert ca["http.response.status_code"] == 200
    assert ca["gateway.backend"] == "up" and ca["gateway.attempt"] == 1
    # the CLIENT span lies inside the root and its length is the upstream time
    assert c.start_ns >= root.start_ns and c.end_ns <= root.end_ns
    assert c.duration_ms == pytest.approx(a["gateway.upstream_time_ms"], abs=0.05)

    # traceresponse names this trace and root; Server-Timing has every hop
    tr = raw.headers["traceresponse"]
    assert tr == f"00-{root.trace_id}-{root.span_id}-01"
    st_header = raw.headers["server-timing"]
    for metric in (
        "cdn;dur=",
        "lb;dur=",
        "intake;dur=",
        "auth;dur=",
        "router;dur=",
        "cache;desc=",
        "upstream;dur=",
        "gateway;dur=",
    ):
        assert metric in st_header, st_header
    cdn_ms = float(re.search(r"cdn;dur=([0-9.]+)", st_header).group(1))
    assert cdn_ms == pytest.approx(names["hop cdn"].duration_ms, abs=0.01)


@pytest.mark.parametrize(
    ("edge", "header", "mark"),
    [
        ("untrusted", None, "untrusted"),
        ("trusted", "future", "future"),
        ("trusted", "stale", "stale"),
        ("trusted", "garbage", "invalid"),
    ],
)
def test_edge_headers_discarded_and_marked(gateway, mock_upstream, receiver, edge, header, mark):
    trusted = '["127.0.0.1/32"]' if edge == "trusted" else "[]"
    cfg = traced(
        mock_upstream.url + "/v1",
        receiver,
        edge=f"""
[edge]
trusted_proxies = {trusted}
[[edge.hops]]
name = "cdn"
header = "x-cdn-start"
""",
    )
    gw = gateway(cfg)
    value = {
        None: f"t={time.time() - 0.01:.3f}",
        "future": f"t={time.time() + 5:.3f}",
        "stale": f"t={time.time() - 120:.3f}",
        "garbage": "t=yesterday",
    }[header]
    r = httpx2.post(
        gw.base_url + "/chat/completions",
        headers={"x-cdn-start": value},
        json={"model": "m", "messages": MSG},
    )
    assert r.status_code == 200
    spans = one_trace(receiver, "POST /v1/chat/completions", 4)
    names = by_name(spans)
    assert "hop cdn" not in names
    assert names["hop intake"].attributes["hop.index"] == 2  # positions stay as configured
    assert names["hop auth"].attributes["hop.index"] == 3
    root = names["POST /v1/chat/completions"]
    assert root.attributes["gateway.edge.discarded"] == [f"cdn:{mark}"]
    assert all(s.duration_ms >= 0 for s in spans)
    assert "cdn;dur" not in r.headers["server-timing"]


def test_grpc_exporter_delivers_the_same_tree(gateway, mock_upstream):
    with OTLPReceiver("grpc") as rec:
        gw = gateway(traced(mock_upstream.url + "/v1", rec, protocol="grpc"))
        httpx2.post(
            gw.base_url + "/embeddings", json={"model": "mock-embedding-3-small", "input": "hi"}
        ).raise_for_status()
        spans = one_trace(rec, "POST /v1/embeddings", 4)
    names = by_name(spans)
    assert {"hop auth", "hop router", "embeddings mock-embedding-3-small"} <= set(names)
    assert names["embeddings mock-embedding-3-small"].attributes["gen_ai.usage.input_tokens"] == 1


def test_incoming_traceparent_is_continued_and_the_client_span_is_the_upstreams_parent(
    gateway, upstream, receiver
):
    answer = answering(b'{"id": "x", "model": "m", "choices": []}')

    up = upstream(answer)
    gw = gateway(traced(up.url, receiver))
    incoming_trace = f"{random.getrandbits(128):032x}"
    incoming_parent = f"{random.getrandbits(64):016x}"
    r = httpx2.post(
        gw.base_url + "/chat/completions",
        json={"model": "m", "messages": MSG},
        headers={
            "traceparent": f"00-{incoming_trace}-{incoming_parent}-01",
            "tracestate": "vendor=abc",
        },
    )
    assert r.status_code == 200
    spans = one_trace(receiver, "POST /v1/chat/completions", 3)
    root = by_name(spans)["POST /v1/chat/completions"]
    client = by_name(spans)["chat m"]
    assert root.trace_id == incoming_trace
    assert root.parent_span_id == incoming_parent
    assert root.trace_state == "vendor=abc"
    sent = up.requests[0].header("traceparent")
    assert sent == f"00-{incoming_trace}-{client.span_id}-01"
    assert up.requests[0].header("tracestate") == "vendor=abc"
    assert r.headers["traceresponse"] == f"00-{incoming_trace}-{root.span_id}-01"


def test_unsampled_incoming_parent_exports_nothing_but_still_propagates(
    gateway, upstream, receiver
):
    answer = answering(b"{}")

    up = upstream(answer)
    gw = gateway(traced(up.url, receiver))
    tid = f"{random.getrandbits(128):032x}"
    r = httpx2.post(
        gw.base_url + "/chat/completions",
        json={"model": "m", "messages": MSG},
        headers={"traceparent": f"00-{tid}-{'1' * 16}-00"},
    )
    assert r.status_code == 200
    sent = parse_traceparent(up.requests[0].header("traceparent").encode())
    assert sent is not None and f"{sent[0]:032x}" == tid and sent[2] is False
    # a sampled request afterwards is exported; the unsampled one never is
    httpx2.post(gw.base_url + "/chat/completions", json={"model": "sampled", "messages": MSG})
    receiver.wait_for(lambda ss: any(s.name == "chat sampled" for s in ss))
    assert not receiver.trace(tid)


def test_untrusted_incoming_traceparent_starts_a_new_trace(gateway, upstream, receiver):
    answer = answering(b"{}")

    gw = gateway(traced(upstream(answer).url, receiver, extra="trust_incoming = false"))
    tid = f"{random.getrandbits(128):032x}"
    httpx2.post(
        gw.base_url + "/chat/completions",
        json={"model": "m", "messages": MSG},
        headers={"traceparent": f"00-{tid}-{'2' * 16}-01"},
    ).raise_for_status()
    spans = one_trace(receiver, "POST /v1/chat/completions", 3)
    root = by_name(spans)["POST /v1/chat/completions"]
    assert root.trace_id != tid and root.parent_span_id is None


def test_streamed_request_carries_ttft(gateway, mock_upstream, receiver):
    gw = gateway(traced(mock_upstream.url + "/v1", receiver))
    client = openai_client(gw.base_url)
    stream = client.chat.completions.create(
        model="mock-gpt-4o",
        messages=MSG,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-mock-ttft-ms": "120"},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
    spans = one_trace(receiver, "POST /v1/chat/completions", 4)
    root = by_name(spans)["POST /v1/chat/completions"]
    client_span = by_name(spans)["chat mock-gpt-4o"]
    assert root.attributes["gateway.ttft_ms"] >= 120
    assert root.attributes["gateway.ttft_ms"] < root.attributes["gateway.request_time_ms"]
    assert client_span.attributes["gen_ai.response.time_to_first_chunk"] >= 0.12
    assert client_span.attributes["gen_ai.request.stream"] is True
    assert root.attributes["gen_ai.usage.output_tokens"] == 12


def test_cut_stream_root_is_error(gateway, upstream, receiver):
    async def cut(req, writer):
        writer.write(sse_head() + chunk(chat_chunk("partial")))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(LAST_CHUNK)  # a clean end of body, but no data: [DONE]
        return True

    gw = gateway(traced(upstream(cut).url, receiver))
    client = openai_client(gw.base_url)
    with pytest.raises(openai.APIError) as info:
        for _ in client.chat.completions.create(model="m", messages=MSG, stream=True):
            pass
    assert "without data: [DONE]" in info.value.message
    spans = one_trace(receiver, "POST /v1/chat/completions", 4)
    root = by_name(spans)["POST /v1/chat/completions"]
    assert root.status_code == "ERROR"
    assert root.attributes["error.type"] == "upstream_stream_truncated"
    assert by_name(spans)["chat m"].status_code == "ERROR"


def test_retries_make_one_client_span_per_attempt(gateway, upstream, receiver):
    seen = []

    async def flaky(req, writer):
        seen.append(req)
        if len(seen) == 1:
            writer.write(http_response(503, b'{"error": {"message": "busy"}}'))
        else:
            writer.write(http_response(200, b'{"id": "ok", "choices": []}'))
        return True

    up = upstream(flaky)
    gw = gateway(traced(up.url, receiver))
    assert (
        httpx2.post(
            gw.base_url + "/chat/completions", json={"model": "m", "messages": MSG}
        ).status_code
        == 200
    )
    spans = one_trace(receiver, "POST /v1/chat/completions", 5)
    clients = sorted(
        (s for s in spans if s.kind == "CLIENT"), key=lambda s: s.attributes["gateway.attempt"]
    )
    assert [c.attributes["http.response.status_code"] for c in clients] == [503, 200]
    assert clients[0].status_code == "ERROR" and clients[1].status_code != "ERROR"
    # each attempt carried its own span as the upstream's parent
    assert [r.header("traceparent").split("-")[2] for r in seen] == [c.span_id for c in clients]
    root = by_name(spans)["POST /v1/chat/completions"]
    total = sum(c.duration_ms for c in clients)
    assert root.attributes["gateway.upstream_time_ms"] == pytest.approx(total, abs=0.05)


@pytest.mark.parametrize("capture", [False, True])
def test_prompt_and_completion_stay_off_spans_unless_configured(
    gateway, mock_upstream, receiver, capture
):
    marker = f"PROMPT-MARKER-{random.getrandbits(32):08x}"
    cfg = traced(
        mock_upstream.url + "/v1",
        receiver,
        extra=f"capture_content = {'true' if capture else 'false'}",
    )
    gw = gateway(cfg)
    client = openai_client(gw.base_url)
    answer = client.chat.completions.create(
        model="mock-gpt-4o", messages=[{"role": "user", "content": f"say {marker}"}]
    )
    completion = answer.choices[0].message.content
    spans = one_trace(receiver, "POST /v1/chat/completions", 4)
    dumped = " ".join(f"{s.name} {s.attributes} {s.events} {s.status_message}" for s in spans)
    assert (marker in dumped) is capture
    assert (completion in dumped) is capture


def test_server_timing_and_no_traceresponse_when_tracing_is_off(gateway, mock_upstream):
    gw = gateway(config_for(mock_upstream.url + "/v1"))
    r = httpx2.post(gw.base_url + "/chat/completions", json={"model": "m", "messages": MSG})
    assert "traceresponse" not in r.headers
    st_header = r.headers["server-timing"]
    assert re.fullmatch(
        r"intake;dur=[0-9.]+, auth;dur=[0-9.]+, router;dur=[0-9.]+, cache;desc=\w+, "
        r"upstream;dur=[0-9.]+, "
        r"gateway;dur=[0-9.]+",
        st_header,
    ), st_header
    # errors carry it too
    bad = httpx2.post(gw.base_url + "/chat/completions", content=b"{")
    assert bad.status_code == 400 and "gateway;dur=" in bad.headers["server-timing"]


def test_tracing_off_forwards_the_clients_traceparent_untouched(gateway, upstream):
    answer = answering(b"{}")

    up = upstream(answer)
    gw = gateway(config_for(up.url))
    tp = f"00-{'a' * 32}-{'b' * 16}-01"
    httpx2.post(
        gw.base_url + "/chat/completions",
        json={"model": "m", "messages": MSG},
        headers={"traceparent": tp},
    ).raise_for_status()
    assert up.requests[0].header("traceparent") == tp


def test_collector_down_requests_succeed_and_failures_are_counted(gateway, mock_upstream):
    dead = OTLPReceiver("http")  # never started: its port is closed
    cfg = traced(mock_upstream.url + "/v1", dead, extra="export_timeout_s = 0.5")
    gw = gateway(cfg)
    client = openai_client(gw.base_url)
    for _ in range(5):
        assert client.chat.completions.create(model="m", messages=MSG).choices
    tracing = gw.app.tracing
    assert tracing is not None and tracing.queue is not None
    deadline = time.monotonic() + 10
    while tracing.queue.failed == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tracing.queue.failed > 0 and tracing.queue.exported == 0
    ready = httpx2.get(gw.url + "/readyz").json()
    assert ready["status"] == "ready" and ready["tracing"]["state"] == "failing"


def test_sample_ratio_zero_exports_nothing(gateway, mock_upstream, receiver):
    gw = gateway(
        traced(mock_upstream.url + "/v1", receiver).__class__(
            **{
                **{
                    f: getattr(traced(mock_upstream.url + "/v1", receiver), f)
                    for f in ("backends", "routes", "server", "edge", "cache", "logging")
                },
                "tracing": TracingConfig(
                    exporter="otlp",
                    endpoint=receiver.endpoint,
                    sample_ratio=0.0,
                    schedule_delay_ms=20,
                ),
            }
        )
    )
    for _ in range(5):
        r = httpx2.post(gw.base_url + "/chat/completions", json={"model": "m", "messages": MSG})
        assert r.status_code == 200
        assert r.headers["traceresponse"].endswith("-00")  # traced, not sampled
    time.sleep(0.2)  # ten export intervals
    assert gw.app.tracing.queue.exported == 0 and receiver.export_requests == 0


# ---------------------------------------------------------------- unit


@given(
    st.integers(min_value=1, max_value=(1 << 128) - 1),
    st.sampled_from([0.0, 0.001, 0.1, 0.5, 0.999, 1.0]),
)
def test_sampling_matches_the_sdks_parent_based_ratio_sampler(trace_id, ratio):
    from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased

    tracing = Tracing(TracingConfig(exporter="none", sample_ratio=ratio))
    sdk = ParentBased(TraceIdRatioBased(ratio))
    want = sdk.should_sample(None, trace_id, "x").decision is Decision.RECORD_AND_SAMPLE
    assert tracing.sample(trace_id) is want


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        (b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", True),
        (b"00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
        (b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", False),
        (b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", True),
        (b"garbage", False),
    ],
)
def test_traceparent_parsing(value, ok):
    assert (parse_traceparent(value) is not None) is ok


def test_cache_lookup_and_store_spans(gateway, mock_upstream, receiver):
    from tests.redis_support import RedisServer

    with RedisServer() as redis:
        cache = f'[cache]\nbackend = "redis"\nurl = "{redis.url}"\ntimeout_ms = 300\n'
        cfg = traced(mock_upstream.url + "/v1", receiver, edge="[edge]\n" + cache)
        gw = gateway(cfg)
        body = {"model": "mock-gpt-4o", "messages": MSG, "temperature": 0}
        first = httpx2.post(gw.base_url + "/chat/completions", json=body)
        second = httpx2.post(gw.base_url + "/chat/completions", json=body)
        assert first.headers["x-gateway-cache"] == "MISS"
        assert second.headers["x-gateway-cache"] == "HIT"
        miss = one_trace(receiver, "POST /v1/chat/completions", 6)
        names = by_name(miss)
        assert names["POST /v1/chat/completions"].attributes["gateway.cache"] == "miss"
        names_miss_root = names["POST /v1/chat/completions"]
        lookup, store = names["cache lookup"], names["cache store"]
        assert lookup.parent_span_id == names["hop router"].span_id
        assert lookup.attributes["db.system.name"] == "redis"
        assert lookup.attributes["gateway.cache"] == "miss"
        assert store.parent_span_id == names["POST /v1/chat/completions"].span_id
        assert store.attributes["gateway.cache.entry_bytes"] > 0
        # the store happens after the answer went out
        assert store.start_ns >= names["chat mock-gpt-4o"].end_ns
        hit_root = receiver.wait_for(
            lambda ss: any(
                s.name == "POST /v1/chat/completions" and s.attributes["gateway.cache"] == "hit"
                for s in ss
            )
        )
        root = next(
            s for s in hit_root if s.kind == "SERVER" and s.attributes.get("gateway.cache") == "hit"
        )
        hit = by_name(receiver.trace(root.trace_id))
        assert "chat mock-gpt-4o" not in hit  # no upstream call on a hit
        assert hit["cache lookup"].attributes["gateway.cache"] == "hit"
        # a hit reports the cached answer's usage without parsing its body
        miss_root = names_miss_root
        assert (
            root.attributes["gen_ai.usage.output_tokens"]
            == miss_root.attributes["gen_ai.usage.output_tokens"]
        )
        assert root.attributes["gateway.upstream_time_ms"] == 0
        redis.kill()
        receiver.clear()
        third = httpx2.post(gw.base_url + "/chat/completions", json=body)
        assert third.status_code == 200 and third.headers["x-gateway-cache"] == "BYPASS"
        spans = one_trace(receiver, "POST /v1/chat/completions", 5)
        names = by_name(spans)
        assert names["POST /v1/chat/completions"].attributes["gateway.cache"] == "bypass"
        assert names["cache lookup"].status_code == "ERROR"
