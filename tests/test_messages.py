"""``POST /v1/messages`` (Anthropic Messages API) through the gateway, driven by the official
``anthropic`` SDK (``base_url`` = the gateway's root: the SDK appends ``/v1/messages``) against
upstreams that are separate servers: routed by model, the backend's key as ``x-api-key``,
validated, streamed event by event (compressed too), cut streams raising, traced, counted, never
cached.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from tests.conftest import BACKEND_KEY
from tests.model_api_support import (
    WORDS,
    engine_upstream,
    messages_events,
    metric_lines,
    metric_value,
    paced,
    raw_events,
    scripted_stream,
    trace_of,
    traced,
    two_routes,
)
from tests.support import anthropic_client
from tests.test_encoding_http import read_events_live

CLIENT_KEY = "sk-ant-client-key-never-forwarded"
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about gateways"}]


def models_seen(up: Any) -> list[str]:
    return [orjson.loads(r.body)["model"] for r in up.requests]


def create(
    c: anthropic.Anthropic, model: str = "claude-sonnet-4", max_tokens: int = 64, **kwargs: Any
) -> Any:
    return c.messages.create(model=model, max_tokens=max_tokens, messages=MESSAGES, **kwargs)


# ---------------------------------------------------------------- the SDK, JSON and streams


def test_create_json_stream_and_the_stream_helper(gateway, mock_upstream, upstream):
    gpt = upstream(engine_upstream())
    gw = gateway(two_routes(mock_upstream.url + "/v1", gpt.url, mock_to="claude"))
    c = anthropic_client(gw.url, CLIENT_KEY)
    msg = create(c, system="Be brief.")
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.model == "claude-sonnet-4" and msg.stop_reason == "end_turn"
    text = msg.content[0].text
    assert msg.usage.output_tokens == len(text.split())

    events = list(create(c, system="Be brief.", stream=True))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert streamed == text  # the mock is deterministic: the same answer, streamed

    with c.messages.stream(
        model="claude-sonnet-4", max_tokens=64, messages=MESSAGES, system="Be brief."
    ) as stream:
        assert stream.get_final_text() == text
    assert gpt.requests == []  # every claude-* call went to the claude backend


def test_routed_by_model_with_the_anthropic_key_headers(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url))
    c = anthropic_client(gw.url, CLIENT_KEY)
    create(c, model="claude-haiku-4")
    list(create(c, model="claude-sonnet-4", stream=True))
    create(c, model="gpt-4.1")  # any API: the model decides the route
    assert models_seen(claude) == ["claude-haiku-4", "claude-sonnet-4"]
    assert models_seen(gpt) == ["gpt-4.1"]
    assert {r.target for r in claude.requests + gpt.requests} == {"/v1/messages"}
    for r in claude.requests:  # provider = "anthropic": x-api-key, never Authorization
        assert r.header("x-api-key") == BACKEND_KEY
        assert r.header("authorization") is None
        assert r.header("anthropic-version") == c.default_headers["anthropic-version"]  # the SDK's
        assert [k.lower() for k, _ in r.headers].count("anthropic-version") == 1
    for r in gpt.requests:  # an openai backend: a Bearer token
        assert r.header("authorization") == f"Bearer {BACKEND_KEY}"
        assert r.header("x-api-key") is None
    seen = b"".join(str(r.headers).encode() + r.body for r in claude.requests + gpt.requests)
    assert CLIENT_KEY.encode() not in seen  # the client's x-api-key never reaches an upstream
    with pytest.raises(anthropic.NotFoundError):
        create(c, model="llama-3")


def test_the_client_s_own_anthropic_version_is_forwarded_unchanged(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url))
    create(
        anthropic_client(gw.url, CLIENT_KEY, default_headers={"anthropic-version": "2023-01-01"})
    )
    (r,) = claude.requests
    assert [v for k, v in r.headers if k.lower() == "anthropic-version"] == ["2023-01-01"]
    assert r.header("x-api-key") == BACKEND_KEY


def test_anthropic_version_is_added_when_the_client_sent_none(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url))
    body = {"model": "claude-x", "max_tokens": 9, "messages": MESSAGES}
    r = httpx2.post(gw.base_url + "/messages", json=body, headers={"x-api-key": CLIENT_KEY})
    assert r.status_code == 200
    (seen,) = claude.requests
    assert seen.header("anthropic-version") == "2023-06-01"  # SPEC §5
    assert seen.header("x-api-key") == BACKEND_KEY


# ---------------------------------------------------------------- validation and policies


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "invalid_messages"),
        ({"messages": []}, "invalid_messages"),
        ({"messages": ["hi"]}, "invalid_messages"),
        ({"messages": [{"content": "hi"}]}, "invalid_messages"),
        ({"messages": [{"role": "user", "content": 7}]}, "invalid_messages"),
        ({"messages": MESSAGES, "max_tokens": 0}, "invalid_value"),
        ({"messages": MESSAGES, "max_tokens": "64"}, "invalid_type"),
        ({"messages": MESSAGES, "system": {"text": "x"}}, "invalid_type"),
        ({"messages": MESSAGES, "top_k": 1.5}, "invalid_type"),
        ({"messages": MESSAGES, "stop_sequences": "END"}, "invalid_type"),
        ({"messages": MESSAGES, "stream": 1}, "invalid_type"),
    ],
)
def test_bad_bodies_are_refused_before_any_upstream(gateway, ups, body, code):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url))
    payload = {"model": "claude-sonnet-4", "max_tokens": 64, **body}
    r = httpx2.post(gw.base_url + "/messages", json=payload, timeout=10)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["message"]
    assert claude.requests == [] and gpt.requests == []


def test_the_sdk_raises_bad_request(gateway, ups):
    gw = gateway(two_routes(*(u.url for u in ups)))
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client(gw.url, CLIENT_KEY).messages.create(
            model="claude-sonnet-4", max_tokens=64, messages=[]
        )


POLICIES = "max_tokens_cap = 5\nhistory_window = 2"


def test_max_tokens_cap_clamps_max_tokens_or_sets_it(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url, route_extra=POLICIES))
    c = anthropic_client(gw.url, CLIENT_KEY)
    capped = create(c)  # 64 -> 5
    create(c, max_tokens=3)
    # no max_tokens at all (the upstream would refuse it): the cap sets it
    r = httpx2.post(
        gw.base_url + "/messages", json={"model": "claude-x", "messages": MESSAGES}, timeout=10
    )
    assert r.status_code == 200
    assert [orjson.loads(x.body)["max_tokens"] for x in claude.requests] == [5, 3, 5]
    assert capped.stop_reason == "max_tokens" and capped.usage.output_tokens == 5


def test_history_window_never_opens_on_an_answer_or_a_tool_result(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url, route_extra=POLICIES))
    tool_use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    tool_result = {"type": "tool_result", "tool_use_id": "t1", "content": "42"}
    history = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": [tool_use]},
        {"role": "user", "content": [tool_result]},
    ]
    anthropic_client(gw.url, CLIENT_KEY).messages.create(
        model="claude-sonnet-4", max_tokens=8, system="Be brief.", messages=history
    )
    sent = orjson.loads(claude.requests[0].body)
    # the last 2 would open on the tool_use answer: the window moves back to the user's "three"
    assert sent["messages"] == history[2:]
    assert sent["system"] == "Be brief."  # a field of its own: always kept


# ---------------------------------------------------------------- streams: unbuffered


def test_each_event_reaches_the_sdk_before_the_upstream_sends_the_next(gateway, upstream):
    sent_at: list[float] = []
    events = messages_events(WORDS[:3])
    claude = upstream(paced(events, sent_at))
    gw = gateway(two_routes(claude.url, claude.url))
    received_at: list[float] = []
    types: list[str] = []
    for event in create(anthropic_client(gw.url, CLIENT_KEY), stream=True):
        received_at.append(time.monotonic())
        types.append(event.type)
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert len(types) == len(events) == len(sent_at)
    for i in range(len(events) - 1):
        assert received_at[i] < sent_at[i + 1], (i, received_at[i] - sent_at[i + 1])


@pytest.mark.parametrize("coding", ["gzip"])  # br: tests/test_responses.py
def test_a_compressed_stream_is_flushed_event_by_event(gateway, upstream, coding):
    sent_at: list[float] = []
    events = messages_events(WORDS[:1])
    claude = upstream(paced(events, sent_at))
    gw = gateway(two_routes(claude.url, claude.url))
    payload = {"model": "claude-x", "max_tokens": 9, "messages": MESSAGES, "stream": True}
    got, received_at, dec, headers = read_events_live(gw.base_url + "/messages", payload, coding)
    assert headers["content-encoding"] == coding
    assert headers["content-type"] == "text/event-stream"
    assert headers["cache-control"] == "no-cache"
    assert headers["x-accel-buffering"] == "no"
    assert "content-length" not in headers
    assert "upstream;dur=" in headers["server-timing"]
    assert dec.finished()
    assert got == events
    for i in range(len(events) - 1):
        assert received_at[i] < sent_at[i + 1], (i, received_at[i] - sent_at[i + 1])


# ---------------------------------------------------------------- streams: cut


def test_mock_cut_stream_raises_in_the_sdk_and_in_the_stream_helper(gateway, mock_upstream):
    url = mock_upstream.url + "/v1"
    gw = gateway(two_routes(url, url, mock_to="claude"))
    c = anthropic_client(gw.url, CLIENT_KEY)
    texts: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as info:
        for event in create(c, model="mock-cut-3", stream=True):
            if event.type == "content_block_delta":
                texts.append(event.delta.text)
    assert type(info.value) is anthropic.APIStatusError  # raised on the stream's error event
    assert len(texts) == 3  # what came before the cut was relayed
    assert info.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "upstream_stream_truncated" in info.value.body["error"]["message"]  # type: ignore[index]
    with (
        pytest.raises(anthropic.APIStatusError, match="message_stop"),
        c.messages.stream(model="mock-cut-2", max_tokens=64, messages=MESSAGES) as stream,
    ):
        stream.get_final_message()


FAULTS = {
    "end": "upstream_stream_truncated",  # the body ends cleanly, without message_stop
    "reset": "upstream_stream_truncated",  # the connection is reset mid-stream
    "stall": "upstream_stream_idle_timeout",  # nothing for longer than stream_idle_timeout_s
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_broken_stream_ends_with_anthropic_s_error_event(gateway, upstream, fault):
    events = messages_events(WORDS[:2], end=False)
    claude = upstream(scripted_stream(events, fault))
    gw = gateway(two_routes(claude.url, claude.url))
    with pytest.raises(anthropic.APIStatusError) as info:
        list(create(anthropic_client(gw.url, CLIENT_KEY), stream=True))
    assert type(info.value) is anthropic.APIStatusError
    payload = {"model": "claude-x", "max_tokens": 9, "messages": MESSAGES, "stream": True}
    got = raw_events(gw.base_url + "/messages", payload)
    assert got[:-1] == events
    name, data = got[-1].split(b"\n", 1)
    assert name == b"event: error"
    error = orjson.loads(data.removeprefix(b"data: "))
    assert set(error) == {"type", "error"} and error["type"] == "error"
    assert error["error"]["type"] == "api_error"
    assert FAULTS[fault] in error["error"]["message"]


def test_events_after_message_stop_are_not_relayed(gateway, upstream):
    events = messages_events(WORDS[:1])
    stray = b'event: ping\ndata: {"type": "ping"}\n\n'
    claude = upstream(scripted_stream([*events, stray], "end"))
    gw = gateway(two_routes(claude.url, claude.url))
    payload = {"model": "claude-x", "max_tokens": 9, "messages": MESSAGES, "stream": True}
    assert raw_events(gw.base_url + "/messages", payload) == events


# ---------------------------------------------------------------- traces, metrics, cache


def test_client_and_root_spans_carry_model_route_and_tokens(gateway, upstream, receiver):
    events = messages_events(WORDS[:3])
    claude = upstream(scripted_stream(events, "end"))
    gw = gateway(two_routes(claude.url, claude.url, extra=traced(receiver.endpoint)))
    raw = anthropic_client(gw.url, CLIENT_KEY).messages.with_raw_response.create(
        model="claude-sonnet-4",
        max_tokens=64,
        messages=MESSAGES,
        stream=True,
        extra_body={"temperature": 0.2},  # this SDK version no longer types it
    )
    assert [e.type for e in raw.parse()][-1] == "message_stop"
    spans = trace_of(receiver, raw.headers, 4)
    span = spans["chat claude-sonnet-4"]
    a = span.attributes
    assert span.kind == "CLIENT" and span.status_code == "UNSET"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "anthropic"
    assert a["gen_ai.request.model"] == "claude-sonnet-4"
    assert a["gen_ai.response.model"] == "claude-test"  # what the upstream said it ran
    assert a["gen_ai.response.id"] == "msg_t1"
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.request.max_tokens"] == 64 and a["gen_ai.request.temperature"] == 0.2
    assert a["gen_ai.response.finish_reasons"] == ["end_turn"]
    # semconv (Anthropic): input = input_tokens + cache reads + cache writes = 9 + 4 + 2
    assert a["gen_ai.usage.input_tokens"] == 15
    assert a["gen_ai.usage.output_tokens"] == 3  # message_delta's total, not message_start's 1
    assert a["gen_ai.response.time_to_first_chunk"] > 0
    root = spans["POST /v1/messages"]
    r = root.attributes
    assert root.kind == "SERVER" and root.status_code == "UNSET"
    assert r["http.route"] == "/v1/messages" and r["gateway.route"] == "claude"
    assert r["gen_ai.request.model"] == "claude-sonnet-4"
    assert (r["gen_ai.usage.input_tokens"], r["gen_ai.usage.output_tokens"]) == (15, 3)
    assert "gateway.ttft_ms" in r


def test_a_json_answer_s_usage_and_a_cut_stream_s_error_on_the_spans(
    gateway, mock_upstream, receiver
):
    url = mock_upstream.url + "/v1"
    gw = gateway(two_routes(url, url, mock_to="claude", extra=traced(receiver.endpoint)))
    c = anthropic_client(gw.url, CLIENT_KEY)
    raw = c.messages.with_raw_response.create(
        model="claude-sonnet-4", max_tokens=64, messages=MESSAGES
    )
    msg = raw.parse()
    a = trace_of(receiver, raw.headers, 4)["chat claude-sonnet-4"].attributes
    assert a["gen_ai.usage.input_tokens"] == msg.usage.input_tokens
    assert a["gen_ai.usage.output_tokens"] == msg.usage.output_tokens
    assert a["gen_ai.response.id"] == msg.id and a["gen_ai.response.finish_reasons"] == ["end_turn"]

    raw = c.messages.with_raw_response.create(
        model="mock-cut-1", max_tokens=64, messages=MESSAGES, stream=True
    )
    with pytest.raises(anthropic.APIStatusError):
        list(raw.parse())
    spans = trace_of(receiver, raw.headers, 4)
    root, span = spans["POST /v1/messages"], spans["chat mock-cut-1"]
    assert root.status_code == "ERROR" and span.status_code == "ERROR"
    assert root.attributes["error.type"] == "upstream_stream_truncated"


def test_requests_tokens_and_cut_streams_are_counted(gateway, mock_upstream):
    url = mock_upstream.url + "/v1"
    gw = gateway(two_routes(url, url, mock_to="claude"))
    c = anthropic_client(gw.url, CLIENT_KEY)
    msg = create(c)
    with pytest.raises(anthropic.APIStatusError):
        list(create(c, model="mock-cut-1", stream=True))
    requests = metric_lines(gw.url, "gateway_requests_total")
    assert metric_value(requests, route="claude", model="claude-sonnet-4", status_code="200") == 1
    tokens = metric_lines(gw.url, "gateway_tokens_total")
    assert metric_value(tokens, model="claude-sonnet-4", kind="input") == msg.usage.input_tokens
    assert metric_value(tokens, model="claude-sonnet-4", kind="output") == msg.usage.output_tokens
    errors = metric_lines(gw.url, "gateway_errors_total")
    assert metric_value(errors, error_type="upstream_stream_truncated") == 1


def test_never_cached_x_gateway_cache_bypass(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url, extra='[cache]\nbackend = "memory"'))
    for stream in (False, False, True, True):
        body = {"model": "claude-x", "max_tokens": 9, "messages": MESSAGES, "stream": stream}
        r = httpx2.post(gw.base_url + "/messages", json=body, timeout=10)
        assert r.status_code == 200 and r.headers["x-gateway-cache"] == "BYPASS"
        assert "cache;desc=bypass" in r.headers["server-timing"]
    assert len(claude.requests) == 4  # each call reached the upstream
