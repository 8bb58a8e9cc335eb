"""A session's telemetry (docs/spec.md §19): its spans (a real OTLP receiver decodes them), the
metrics a real scrape reads, one access-log line, the live view's record."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

import gateway as gateway_pkg
from gateway.config import load_config
from tests.model_api_support import traced
from tests.otlp_receiver import OTLPReceiver
from tests.realtime.test_handshake import run, ws_url
from tests.realtime.test_message_relay import CREATE
from tests.realtime.test_session import sdk_turn
from tests.realtime_support import SESSION_ID, VAD_PAUSE_S
from tests.support import config_for


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver("http") as r:
        yield r


#: a response.create whose type is not first: the relay must still see it start a response
LATE_CREATE = '{"event_id":"event_client_2","type":"response.create"}'


async def two_responses(gw: Any) -> None:
    """A raw client: two responses in one session, then a normal close."""
    async with connect(ws_url(gw), open_timeout=10) as ws:
        await ws.recv()
        for create in (CREATE, LATE_CREATE):
            await ws.send(create)
            while orjson.loads(await ws.recv())["type"] != "response.done":
                pass


def test_one_trace_per_session_with_a_span_per_response(gateway, realtime_upstream, receiver):
    up = realtime_upstream(deltas=3)
    gw = gateway(config_for(up.url, extra=traced(receiver.endpoint)))
    run(two_responses(gw))
    spans = receiver.wait_for(lambda s: any(x.name == "GET /v1/realtime" for x in s))
    (root,) = [s for s in spans if s.name == "GET /v1/realtime"]
    trace = receiver.trace(root.trace_id)
    assert root.kind == "SERVER" and root.parent_span_id is None
    a = root.attributes
    assert a["http.route"] == "/v1/realtime" and a["http.response.status_code"] == 101
    assert a["gateway.realtime.messages_in"] == 2
    assert a["gateway.realtime.messages_out"] == 1 + 2 * 5  # session.created + 2 x 5 events
    assert a["gateway.realtime.close_code"] == 1000
    assert a["gateway.realtime.responses"] == 2
    assert a["gen_ai.usage.input_tokens"] == 20 and a["gen_ai.usage.output_tokens"] == 10
    assert a["gen_ai.conversation.id"] == SESSION_ID  # the upstream's session.created
    names = [s.name for s in trace]
    assert {"hop intake", "hop auth", "hop router"} <= set(names)
    (attempt,) = [s for s in trace if s.kind == "CLIENT"]
    assert attempt.name == "realtime gpt-realtime"
    assert attempt.attributes["gen_ai.operation.name"] == "realtime"
    assert attempt.attributes["http.response.status_code"] == 101
    # the handshake's span id is the one the upstream got as its parent
    (seen,) = up.wait_ended()
    assert seen.header("traceparent") == f"00-{root.trace_id}-{attempt.span_id}-01"
    assert attempt.end_ns <= root.end_ns
    responses = [s for s in trace if s.name == "realtime response"]
    assert len(responses) == 2
    for r in responses:
        assert r.parent_span_id == root.span_id
        assert r.attributes["gen_ai.operation.name"] == "realtime"
        assert r.attributes["gen_ai.response.id"].startswith("resp_")
        assert r.attributes["gen_ai.conversation.id"] == SESSION_ID
        assert r.attributes["gen_ai.usage.input_tokens"] == 10
        assert r.attributes["gen_ai.usage.cache_read.input_tokens"] == 4
        assert r.attributes["gen_ai.usage.output_tokens"] == 5
        # TTFT: the first delta written to the client minus the client's response.create
        assert 0 < r.attributes["gateway.ttft_ms"] <= r.duration_ms + 50


def test_metrics_count_sessions_overhead_ttft_and_tokens(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))

    async def open_one() -> float:
        async with connect(ws_url(gw), open_timeout=10) as ws:
            await ws.recv()
            text = httpx2.get(gw.url + "/metrics").text  # while it is open
            await ws.close(4000, "done")
        return _value(text, "gateway_realtime_sessions")

    assert run(open_one()) == 1.0
    run(two_responses(gw))
    up.wait_ended(2)
    text = _once_closed(gw.url, 2)
    assert _value(text, "gateway_realtime_sessions") == 0.0
    assert _value(text, "gateway_realtime_sessions_total", close_code="4000") == 1.0
    assert _value(text, "gateway_realtime_sessions_total", close_code="1000") == 1.0
    for direction, count in (("client_to_upstream", 2.0), ("upstream_to_client", 12.0)):
        got = _value(text, "gateway_realtime_message_overhead_seconds_count", direction=direction)
        assert got == count, direction
    assert _value(text, "gateway_time_to_first_token_seconds_count", model="*") == 2.0
    assert _value(text, "gateway_tokens_total", model="*", kind="input") == 20.0
    assert _value(text, "gateway_tokens_total", model="*", kind="cached_input") == 8.0
    # OpenMetrics (what Prometheus asks for first) parses too, exemplars and all
    om = httpx2.get(
        gw.url + "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
    ).text
    names = {f.name for f in om_families(om)}
    assert {"gateway_realtime_sessions", "gateway_realtime_message_overhead_seconds"} <= names


def _once_closed(url: str, sessions: int) -> str:
    """/metrics once ``sessions`` sessions have ended (the gateway counts a session once both
    sides are closed: just after the upstream saw its close)."""
    deadline = time.monotonic() + 10
    while True:
        text = httpx2.get(url + "/metrics").text
        ended = sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "gateway_realtime_sessions_total"
        )
        if ended >= sessions or time.monotonic() > deadline:
            return text
        time.sleep(0.01)


def _value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"{name}{labels} not in /metrics")


def test_one_access_log_line_per_session_and_a_live_view_record(
    gateway, realtime_upstream, access_lines
):
    up = realtime_upstream()
    gw = gateway(config_for(up.url, extra='[logging]\naccess_log = "all"\n[ui]\nenabled = true'))
    run(two_responses(gw))
    up.wait_ended()
    # the line is written once the session has closed both sides: after the upstream ended
    deadline = time.monotonic() + 10
    while not access_lines and time.monotonic() < deadline:
        time.sleep(0.01)
    lines = [x for x in access_lines if x["path"] == "/v1/realtime"]
    assert len(lines) == 1
    (rec,) = lines
    assert rec["status"] == 101 and rec["model"] == "gpt-realtime" and rec["backend"] == "up"
    assert rec["realtime"] == {
        "messages_in": 2,
        "messages_out": 11,
        "responses": 2,
        "close_code": 1000,
        "closed_by": "client",
    }
    assert rec["tokens"]["input"] == 20 and rec["tokens"]["output"] == 10
    assert 0 <= rec["overhead_ms"] < rec["request_time_ms"]
    records = httpx2.get(gw.url + "/_gateway/api/requests").json()["requests"]
    (live,) = [r for r in records if r["path"] == "/v1/realtime"]
    assert live["status"] == 101 and live["model"] == "gpt-realtime"


def test_credentials_stay_out_of_logs_spans_and_the_live_view(
    gateway, realtime_upstream, access_lines, receiver
):
    up = realtime_upstream()
    key = "sk-subprotocol-secret"
    gw = gateway(
        config_for(
            up.url,
            extra='[logging]\naccess_log = "all"\n[ui]\nenabled = true\n'
            + traced(receiver.endpoint),
        )
    )

    async def main() -> None:
        offered = ["realtime", f"openai-insecure-api-key.{key}"]
        async with connect(ws_url(gw), subprotocols=offered, open_timeout=10) as ws:
            await ws.recv()

    run(main())
    up.wait_ended()
    receiver.wait_for(lambda s: any(x.name == "GET /v1/realtime" for x in s))
    everything = (
        repr(access_lines)
        + repr([s.attributes for s in receiver.spans])
        + httpx2.get(gw.url + "/_gateway/api/requests").text
    )
    assert key not in everything


def test_the_sdk_session_through_the_embedded_default_is_traced(gateway, receiver):
    """The embedded default (mock:// in process) plus tracing: the response span is there."""
    text = (Path(gateway_pkg.__file__).parent / "default.toml").read_text()
    gw = gateway(load_config(text=text + traced(receiver.endpoint)))
    run(sdk_turn(gw.base_url, "gpt-4o"))
    spans = receiver.wait_for(lambda s: any(x.name == "realtime response" for x in s))
    (response,) = [s for s in spans if s.name == "realtime response"]
    assert response.attributes["gen_ai.usage.output_tokens"] > 0
    assert response.attributes["gateway.ttft_ms"] >= 0


def test_with_server_vad_ttft_counts_from_the_upstreams_commit(
    gateway, realtime_upstream, receiver
):
    """No response.create: the turn the response answers ended when the upstream committed the
    audio buffer, so TTFT runs from that event's write to the client (docs/spec.md §19) — not
    from the client's audio, VAD_PAUSE_S earlier."""
    up = realtime_upstream(deltas=2)
    gw = gateway(config_for(up.url, extra=traced(receiver.endpoint)))

    async def talk() -> float:
        async with connect(ws_url(gw, model="vad"), open_timeout=10) as ws:
            await ws.recv()
            spoke = time.perf_counter()
            await ws.send('{"type":"input_audio_buffer.append","audio":"AAAA"}')
            while orjson.loads(await ws.recv())["type"] != "response.output_text.delta":
                pass
            heard = time.perf_counter()
            while orjson.loads(await ws.recv())["type"] != "response.done":
                pass
        return (heard - spoke) * 1000

    client_ms = run(talk())
    spans = receiver.wait_for(lambda s: any(x.name == "realtime response" for x in s))
    (response,) = [s for s in spans if s.name == "realtime response"]
    ttft = response.attributes["gateway.ttft_ms"]
    # the commit was written at least VAD_PAUSE_S after the audio was sent, and the first delta
    # before the client read it: measured from the audio instead, it would exceed this bound
    assert 0 < ttft <= client_ms - VAD_PAUSE_S * 1000
