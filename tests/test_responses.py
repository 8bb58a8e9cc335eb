"""``POST /v1/responses`` (OpenAI Responses API) through the gateway, driven by the official
``openai`` SDK against upstreams that are separate servers: routed by model, validated, streamed
event by event (compressed too), cut streams raising in the SDK, traced, counted, never cached.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx2
import openai
import orjson
import pytest

from gateway.cache.keys import is_cacheable
from gateway.telemetry.logs import ACCESS_LOGGER
from tests.conftest import BACKEND_KEY
from tests.model_api_support import (
    WORDS,
    engine_upstream,
    metric_lines,
    metric_value,
    paced,
    raw_events,
    responses_events,
    scripted_stream,
    trace_of,
    traced,
    two_routes,
)
from tests.support import openai_client
from tests.test_encoding_http import read_events_live

PROMPT = "Tell me about gateways"


def models_seen(up: Any) -> list[str]:
    return [orjson.loads(r.body)["model"] for r in up.requests]


# ---------------------------------------------------------------- the SDK, JSON and streams


def test_create_json_stream_and_the_stream_helper(gateway, mock_upstream, upstream):
    claude = upstream(engine_upstream())
    gw = gateway(two_routes(claude.url, mock_upstream.url + "/v1"))
    oai = openai_client(gw.base_url, "sk-client-key")
    resp = oai.responses.create(model="gpt-4.1", input=PROMPT, instructions="Be brief.")
    assert resp.object == "response" and resp.status == "completed"
    assert resp.model == "gpt-4.1" and resp.output_text
    assert resp.usage is not None and resp.usage.output_tokens == len(resp.output_text.split())

    events = list(
        oai.responses.create(model="gpt-4.1", input=PROMPT, instructions="Be brief.", stream=True)
    )
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == resp.output_text  # the mock is deterministic: the same answer, streamed

    with oai.responses.stream(model="gpt-4.1", input=PROMPT, instructions="Be brief.") as stream:
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == resp.output_text
    assert claude.requests == []  # every gpt-* call went to the gpt backend


def test_routed_by_model_to_the_route_s_backend(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url))
    oai = openai_client(gw.base_url, "sk-client-key")
    oai.responses.create(model="gpt-4.1-mini", input=PROMPT)
    list(oai.responses.create(model="gpt-4.1", input=PROMPT, stream=True))
    oai.responses.create(model="claude-sonnet-4", input=PROMPT)  # any API: the model decides
    assert models_seen(gpt) == ["gpt-4.1-mini", "gpt-4.1"]
    assert models_seen(claude) == ["claude-sonnet-4"]
    assert {r.target for r in gpt.requests + claude.requests} == {"/v1/responses"}
    for r in gpt.requests:  # an openai backend: its key as a Bearer token, never the client's
        assert r.header("authorization") == f"Bearer {BACKEND_KEY}"
        assert r.header("x-api-key") is None
    with pytest.raises(openai.NotFoundError) as info:
        oai.responses.create(model="llama-3", input=PROMPT)
    assert info.value.code == "model_not_found"


def test_a_failing_backend_is_retried(gateway, upstream):
    """Same retries as chat: a 503 before any byte is sent again."""
    answered = engine_upstream()
    calls: list[int] = []

    async def flaky(req, writer):
        calls.append(1)
        if len(calls) == 1:
            writer.write(b"HTTP/1.1 503 Busy\r\ncontent-length: 2\r\n\r\n{}")
            return True
        return await answered(req, writer)

    gpt = upstream(flaky)
    gw = gateway(two_routes(gpt.url, gpt.url))
    assert (
        openai_client(gw.base_url, "sk-client-key")
        .responses.create(model="gpt-4.1", input=PROMPT)
        .status
        == "completed"
    )
    assert len(calls) == 2


# ---------------------------------------------------------------- validation and policies


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"input": 7}, "invalid_input"),
        ({"input": []}, "invalid_input"),
        ({"input": ["not an item"]}, "invalid_input"),
        ({"input": "x", "max_output_tokens": 0}, "invalid_value"),
        ({"input": "x", "max_output_tokens": "10"}, "invalid_value"),
        ({"input": "x", "instructions": ["no"]}, "invalid_type"),
        ({"input": "x", "temperature": "hot"}, "invalid_type"),
        ({"input": "x", "stream": "yes"}, "invalid_type"),
        ({"input": "x", "model": ""}, "invalid_model"),
    ],
)
def test_bad_bodies_are_refused_before_any_upstream(gateway, ups, body, code):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url))
    r = httpx2.post(gw.base_url + "/responses", json={"model": "gpt-4.1", **body}, timeout=10)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["message"]
    assert gpt.requests == [] and claude.requests == []


def test_the_sdk_raises_bad_request(gateway, ups):
    gw = gateway(two_routes(*(u.url for u in ups)))
    with pytest.raises(openai.BadRequestError) as info:
        openai_client(gw.base_url, "sk-client-key").responses.create(
            model="gpt-4.1", input=PROMPT, max_output_tokens=0
        )
    assert info.value.code == "invalid_value"


POLICIES = "max_tokens_cap = 5\nhistory_window = 2"


def test_max_tokens_cap_clamps_max_output_tokens_or_sets_it(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url, route_extra=POLICIES))
    oai = openai_client(gw.base_url, "sk-client-key")
    capped = oai.responses.create(model="gpt-4.1", input=PROMPT, max_output_tokens=50)
    oai.responses.create(model="gpt-4.1", input=PROMPT)
    oai.responses.create(model="gpt-4.1", input=PROMPT, max_output_tokens=3)
    sent = [orjson.loads(r.body).get("max_output_tokens") for r in gpt.requests]
    assert sent == [5, 5, 3]
    assert capped.status == "incomplete"  # the mock stops at the cap, as the API would
    assert capped.incomplete_details is not None
    assert capped.incomplete_details.reason == "max_output_tokens"
    assert all("max_tokens" not in orjson.loads(r.body) for r in gpt.requests)


def test_history_window_keeps_instructions_and_never_opens_on_a_tool_output(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url, route_extra=POLICIES))
    items = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"role": "user", "content": "three"},
    ]
    openai_client(gw.base_url, "sk-client-key").responses.create(model="gpt-4.1", input=items)  # type: ignore[arg-type]
    openai_client(gw.base_url, "sk-client-key").responses.create(
        model="gpt-4.1", input=PROMPT
    )  # a string: nothing to window
    windowed, plain = (orjson.loads(r.body)["input"] for r in gpt.requests)
    # the last 2 would open on the tool output (its call cut off): the window moves to "three"
    assert windowed == [items[0], items[5]]
    assert plain == PROMPT


# ---------------------------------------------------------------- streams: unbuffered


def test_each_event_reaches_the_sdk_before_the_upstream_sends_the_next(gateway, upstream):
    sent_at: list[float] = []
    events = responses_events(WORDS)
    gpt = upstream(paced(events, sent_at))
    gw = gateway(two_routes(gpt.url, gpt.url))
    received_at: list[float] = []
    types: list[str] = []
    for event in openai_client(gw.base_url, "sk-client-key").responses.create(
        model="gpt-4.1", input=PROMPT, stream=True
    ):
        received_at.append(time.monotonic())
        types.append(event.type)
    assert types == ["response.created"] + ["response.output_text.delta"] * len(WORDS) + [
        "response.completed"
    ]
    assert len(sent_at) == len(events)
    for i in range(len(events) - 1):
        assert received_at[i] < sent_at[i + 1], (i, received_at[i] - sent_at[i + 1])


@pytest.mark.parametrize("coding", ["br"])  # gzip: tests/test_messages.py
def test_a_compressed_stream_is_flushed_event_by_event(gateway, upstream, coding):
    sent_at: list[float] = []
    events = responses_events(WORDS[:3])
    gpt = upstream(paced(events, sent_at))
    gw = gateway(two_routes(gpt.url, gpt.url))
    got, received_at, dec, headers = read_events_live(
        gw.base_url + "/responses", {"model": "gpt-4.1", "input": PROMPT, "stream": True}, coding
    )
    assert headers["content-encoding"] == coding
    assert headers["content-type"] == "text/event-stream"
    assert headers["cache-control"] == "no-cache"
    assert headers["x-accel-buffering"] == "no"
    assert headers["vary"] == "Accept-Encoding"
    assert "content-length" not in headers
    assert "upstream;dur=" in headers["server-timing"]
    assert dec.finished()
    assert got == events  # relayed byte for byte, nothing after the terminal event
    for i in range(len(events) - 1):
        assert received_at[i] < sent_at[i + 1], (i, received_at[i] - sent_at[i + 1])


# ---------------------------------------------------------------- streams: complete or cut


@pytest.mark.parametrize("end", ["response.incomplete", "response.failed"])
def test_every_terminal_event_completes_the_stream(gateway, upstream, end):
    events = responses_events(WORDS[:2], end=end)
    gpt = upstream(scripted_stream(events, "end"))
    gw = gateway(two_routes(gpt.url, gpt.url))
    got = list(
        openai_client(gw.base_url, "sk-client-key").responses.create(
            model="gpt-4.1", input=PROMPT, stream=True
        )
    )
    assert [e.type for e in got][-1] == end  # no error event after it: the answer is whole


def test_mock_cut_stream_raises_in_the_sdk_and_in_the_stream_helper(gateway, mock_upstream):
    gw = gateway(two_routes(mock_upstream.url + "/v1", mock_upstream.url + "/v1"))
    oai = openai_client(gw.base_url, "sk-client-key")
    deltas: list[str] = []
    with pytest.raises(openai.APIError) as info:
        for event in oai.responses.create(model="mock-cut-3", input=PROMPT, stream=True):
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
    assert type(info.value) is openai.APIError  # raised from the stream, not a status error
    assert len(deltas) == 3  # what came before the cut was relayed
    assert info.value.body["type"] == "upstream_stream_truncated"  # type: ignore[index]
    assert "response.completed" in info.value.message
    with (
        pytest.raises(openai.APIError, match="ended without"),
        oai.responses.stream(model="mock-cut-2", input=PROMPT) as stream,
    ):
        stream.get_final_response()


FAULTS = {
    "end": "upstream_stream_truncated",  # the body ends cleanly, without a terminal event
    "reset": "upstream_stream_truncated",  # the connection is reset mid-stream
    "stall": "upstream_stream_idle_timeout",  # nothing for longer than stream_idle_timeout_s
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_broken_stream_ends_with_an_error_event_the_sdk_raises(gateway, upstream, fault):
    events = responses_events(WORDS[:2], end=None)
    gpt = upstream(scripted_stream(events, fault))
    gw = gateway(two_routes(gpt.url, gpt.url))
    with pytest.raises(openai.APIError) as info:
        list(
            openai_client(gw.base_url, "sk-client-key").responses.create(
                model="gpt-4.1", input=PROMPT, stream=True
            )
        )
    assert type(info.value) is openai.APIError
    assert info.value.body["type"] == FAULTS[fault]  # type: ignore[index]
    # on the wire: the upstream's events, then one `error` event shaped like the API's own
    got = raw_events(
        gw.base_url + "/responses", {"model": "gpt-4.1", "input": PROMPT, "stream": True}
    )
    assert got[:-1] == events
    name, data = got[-1].split(b"\n", 1)
    assert name == b"event: error"
    error = orjson.loads(data.removeprefix(b"data: "))
    assert error["type"] == "error" and error["code"] == FAULTS[fault]
    assert error["sequence_number"] == len(events)  # it continues the stream's numbering
    assert error["error"]["type"] == FAULTS[fault] and error["error"]["message"]


def test_a_stream_cut_before_its_first_event_is_a_502(gateway, upstream):
    async def empty(req, writer):
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 0\r\n\r\n"
        )
        return True

    gw = gateway(two_routes(upstream(empty).url, upstream(empty).url))
    with pytest.raises(openai.APIStatusError) as info:
        list(
            openai_client(gw.base_url, "sk-client-key").responses.create(
                model="gpt-4.1", input=PROMPT, stream=True
            )
        )
    assert info.value.status_code == 502


# ---------------------------------------------------------------- traces, metrics, log, cache


def test_client_and_root_spans_carry_model_route_and_tokens(gateway, ups, receiver):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url, extra=traced(receiver.endpoint)))
    oai = openai_client(gw.base_url, "sk-client-key")
    raw = oai.responses.with_raw_response.create(
        model="gpt-4.1", input=PROMPT, max_output_tokens=40, temperature=0.5
    )
    resp = raw.parse()
    assert resp.usage is not None
    spans = trace_of(receiver, raw.headers, 4)
    span = spans["chat gpt-4.1"]
    assert span.kind == "CLIENT" and span.status_code == "UNSET"
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "gpt-4.1" and a["gen_ai.response.model"] == "gpt-4.1"
    assert a["gen_ai.request.stream"] is False
    assert a["gen_ai.request.max_tokens"] == 40 and a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.response.id"] == resp.id
    assert a["gen_ai.response.finish_reasons"] == ["completed"]
    assert a["gen_ai.usage.input_tokens"] == resp.usage.input_tokens
    assert a["gen_ai.usage.output_tokens"] == resp.usage.output_tokens
    assert a["gateway.backend"] == "gpt" and a["server.port"] == gpt.port
    root = spans["POST /v1/responses"]
    r = root.attributes
    assert root.kind == "SERVER" and root.status_code == "UNSET"
    assert r["http.route"] == "/v1/responses" and r["gateway.route"] == "gpt"
    assert r["gen_ai.request.model"] == "gpt-4.1"
    assert r["gen_ai.usage.input_tokens"] == resp.usage.input_tokens
    assert r["gen_ai.usage.output_tokens"] == resp.usage.output_tokens

    raw = oai.responses.with_raw_response.create(model="gpt-4.1", input=PROMPT, stream=True)
    events = list(raw.parse())
    done = events[-1]
    assert done.type == "response.completed" and done.response.usage is not None
    a = trace_of(receiver, raw.headers, 4)["chat gpt-4.1"].attributes
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.usage.output_tokens"] == done.response.usage.output_tokens
    assert a["gen_ai.response.time_to_first_chunk"] > 0  # from the first output_text.delta
    assert "gateway.ttft_ms" in trace_of(receiver, raw.headers, 4)["POST /v1/responses"].attributes


def test_a_cut_stream_makes_the_root_and_client_spans_error(gateway, mock_upstream, receiver):
    url = mock_upstream.url + "/v1"
    gw = gateway(two_routes(url, url, extra=traced(receiver.endpoint)))
    raw = openai_client(gw.base_url, "sk-client-key").responses.with_raw_response.create(
        model="mock-cut-2", input=PROMPT, stream=True
    )
    with pytest.raises(openai.APIError):
        list(raw.parse())
    spans = trace_of(receiver, raw.headers, 4)
    root, span = spans["POST /v1/responses"], spans["chat mock-cut-2"]
    assert root.status_code == "ERROR" and span.status_code == "ERROR"
    assert root.attributes["error.type"] == "upstream_stream_truncated"
    assert span.attributes["error.type"] == "upstream_stream_truncated"
    assert root.attributes["gateway.route"] == "mock"


def test_requests_tokens_and_cut_streams_are_counted(gateway, mock_upstream):
    url = mock_upstream.url + "/v1"
    gw = gateway(two_routes(url, url))
    oai = openai_client(gw.base_url, "sk-client-key")
    resp = oai.responses.create(model="gpt-4.1", input=PROMPT)
    with pytest.raises(openai.APIError):
        list(oai.responses.create(model="mock-cut-1", input=PROMPT, stream=True))
    assert resp.usage is not None
    requests = metric_lines(gw.url, "gateway_requests_total")
    assert metric_value(requests, route="gpt", model="gpt-4.1", status_code="200") == 1
    tokens = metric_lines(gw.url, "gateway_tokens_total")
    assert metric_value(tokens, model="gpt-4.1", kind="input") == resp.usage.input_tokens
    assert metric_value(tokens, model="gpt-4.1", kind="output") == resp.usage.output_tokens
    errors = metric_lines(gw.url, "gateway_errors_total")
    assert metric_value(errors, error_type="upstream_stream_truncated") == 1


def test_access_log_line_has_route_backend_and_tokens(gateway, ups):
    lines: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(orjson.loads(record.getMessage()))

    handler = Collect()
    logging.getLogger(ACCESS_LOGGER).addHandler(handler)
    try:
        gw = gateway(two_routes(*(u.url for u in ups), extra='[logging]\naccess_log = "all"'))
        resp = openai_client(gw.base_url, "sk-client-key").responses.create(
            model="gpt-4.1", input=PROMPT
        )
        deadline = time.monotonic() + 5
        while not lines and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        logging.getLogger(ACCESS_LOGGER).removeHandler(handler)
    assert resp.usage is not None
    (line,) = (x for x in lines if x["path"] == "/v1/responses")
    assert (line["route"], line["backend"], line["model"]) == ("gpt", "gpt", "gpt-4.1")
    assert line["tokens"] == {"input": resp.usage.input_tokens, "output": resp.usage.output_tokens}
    assert PROMPT not in orjson.dumps(line).decode()


def test_never_cached_x_gateway_cache_bypass(gateway, ups):
    claude, gpt = ups
    gw = gateway(two_routes(claude.url, gpt.url, extra='[cache]\nbackend = "memory"'))
    for stream in (False, False, True, True):
        body = {"model": "gpt-4.1", "input": PROMPT, "stream": stream}
        r = httpx2.post(gw.base_url + "/responses", json=body, timeout=10)
        assert r.status_code == 200 and r.headers["x-gateway-cache"] == "BYPASS"
    assert len(gpt.requests) == 4  # each call reached the upstream


@pytest.mark.parametrize("mode", ["deterministic", "all"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/responses", {"model": "gpt-4.1", "input": PROMPT}),
        (
            "/messages",
            {
                "model": "gpt-4.1",
                "max_tokens": 9,
                "messages": [{"role": "user", "content": PROMPT}],
            },
        ),
    ],
)
def test_temperature_0_is_still_bypass(gateway, ups, mode, path, body):
    """A Responses or Messages call is a "chat" operation (semconv) yet never cached."""
    claude, gpt = ups
    cache = f'[cache]\nbackend = "memory"\nmode = "{mode}"'
    gw = gateway(two_routes(claude.url, gpt.url, extra=cache))
    for _ in range(2):
        r = httpx2.post(gw.base_url + path, json={**body, "temperature": 0}, timeout=10)
        assert r.status_code == 200 and r.headers["x-gateway-cache"] == "BYPASS"
    assert len(gpt.requests) == 2


def test_responses_and_messages_paths_are_not_cacheable_even_at_temperature_0():
    payload = {"model": "m", "input": "x", "temperature": 0}
    assert is_cacheable("chat", payload, "deterministic", "/v1/chat/completions")
    for path in ("/v1/responses", "/v1/messages"):
        assert not is_cacheable("chat", payload, "deterministic", path)
        assert not is_cacheable("chat", payload, "all", path)
