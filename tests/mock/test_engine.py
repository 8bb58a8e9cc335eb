"""The mock engine's Responses and Messages answers, checked against the official SDKs' models.

Every body and every stream event is validated with the pydantic models the ``openai`` and
``anthropic`` SDKs parse into, so a missing required field fails here, not in a user's client.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.config import BackendConfig
from gateway.mock.engine import (
    DEFAULT_COMPLETION_TOKENS,
    MockReply,
    MockSettings,
    bad_request,
    reply,
)
from gateway.transports.mock_impl import MockTransport

RESPONSE_EVENT = TypeAdapter(ResponseStreamEvent)
MESSAGE_EVENT = TypeAdapter(RawMessageStreamEvent)
MESSAGES = [{"role": "user", "content": "Tell me about gateways"}]

RESPONSES_SEQUENCE = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * DEFAULT_COMPLETION_TOKENS,
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
MESSAGES_SEQUENCE = [
    "message_start",
    "content_block_start",
    "ping",
    *["content_block_delta"] * DEFAULT_COMPLETION_TOKENS,
    "content_block_stop",
    "message_delta",
    "message_stop",
]


def post(path: str, body: dict[str, Any], settings: MockSettings | None = None) -> MockReply:
    return reply("POST", path, orjson.dumps(body), settings)


def json_of(r: MockReply) -> Any:
    assert r.body is not None and r.events is None
    return orjson.loads(r.body)


def raw_stream(r: MockReply) -> bytes:
    assert r.status == 200 and r.content_type == "text/event-stream" and r.events is not None
    events = r.events

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in events])

    return asyncio.run(collect())


def sse(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) per SSE event; asserts every event is well formed."""
    assert raw == b"" or raw.endswith(b"\n\n")
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            else:
                assert field == "data", line
                data.append(value)
        out.append((name, "\n".join(data)))
    return out


def named_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Events of a Responses / Messages stream: each names itself twice, consistently."""
    out = []
    for name, data in sse(raw):
        obj = orjson.loads(data)
        assert name is not None and obj["type"] == name
        out.append((name, obj))
    return out


# ---------------------------------------------------------------- /responses


def test_responses_json_is_a_completed_response_the_sdk_model_accepts():
    body = {
        "model": "mock-gpt-4o",
        "input": "Tell me about gateways",
        "instructions": "Be brief.",
        "metadata": {"team": "a"},
        "temperature": 0.5,
    }
    r = post("/responses", body)
    assert r.status == 200 and r.content_type == "application/json"
    resp = Response.model_validate(json_of(r))
    assert resp.object == "response" and resp.id.startswith("resp_mock")
    assert resp.status == "completed" and resp.incomplete_details is None
    assert resp.completed_at is not None and resp.completed_at >= resp.created_at
    assert resp.model == "mock-gpt-4o"
    assert resp.instructions == "Be brief." and resp.metadata == {"team": "a"}
    assert resp.temperature == 0.5
    [message] = resp.output
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "completed" and message.id.startswith("msg_mock")
    [part] = message.content
    assert part.type == "output_text" and part.annotations == []
    assert len(part.text.split()) == DEFAULT_COMPLETION_TOKENS
    assert resp.output_text == part.text
    usage = resp.usage
    assert usage is not None
    assert usage.output_tokens == DEFAULT_COMPLETION_TOKENS
    # words of input + instructions, plus a per-item overhead like the chat mock's
    assert usage.input_tokens == 4 + 2 + 3
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_responses_input_items_with_content_parts_are_read():
    items = [
        {"role": "developer", "content": "Answer in one line"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi a b"}]},
    ]
    resp = Response.model_validate(json_of(post("/responses", {"model": "m", "input": items})))
    assert resp.usage is not None and resp.usage.input_tokens == 4 + 3 + 2 * 3
    assert resp.status == "completed"


@pytest.mark.parametrize(
    ("limit", "tokens", "status"),
    [(5, 5, "incomplete"), (DEFAULT_COMPLETION_TOKENS, DEFAULT_COMPLETION_TOKENS, "completed")],
)
def test_responses_max_output_tokens_cuts_the_answer_and_says_so(limit, tokens, status):
    r = post("/responses", {"model": "m", "input": "x", "max_output_tokens": limit})
    resp = Response.model_validate(json_of(r))
    assert resp.status == status and resp.output[0].status == status
    assert resp.max_output_tokens == limit
    assert len(resp.output_text.split()) == tokens
    assert resp.usage is not None and resp.usage.output_tokens == tokens
    if status == "incomplete":
        assert resp.incomplete_details is not None
        assert resp.incomplete_details.reason == "max_output_tokens"
        assert resp.completed_at is None
    else:
        assert resp.incomplete_details is None


def test_responses_stream_is_the_real_event_sequence_and_matches_the_json_answer():
    body = {"model": "m", "input": "Tell me about gateways"}
    raw = raw_stream(post("/responses", {**body, "stream": True}))
    assert b"[DONE]" not in raw
    events = named_events(raw)
    assert [name for name, _ in events] == RESPONSES_SEQUENCE
    parsed = [RESPONSE_EVENT.validate_python(obj) for _, obj in events]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    created, in_progress = parsed[0], parsed[1]
    assert created.response.status == in_progress.response.status == "in_progress"
    assert created.response.output == [] and created.response.usage is None
    deltas = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
    done, final = parsed[-4], parsed[-1]
    assert done.type == "response.output_text.done" and done.text == deltas
    assert final.type == "response.completed" and final.response.output_text == deltas
    assert final.response.usage is not None
    assert final.response.usage.output_tokens == DEFAULT_COMPLETION_TOKENS
    item_ids = {e.item_id for e in parsed if hasattr(e, "item_id")}
    assert item_ids == {final.response.output[0].id}
    assert {created.response.id, final.response.id} == {final.response.id}
    # the same request as JSON answers the same text and usage, under ids of its own
    whole = Response.model_validate(json_of(post("/responses", body)))
    assert whole.output_text == deltas and whole.usage == final.response.usage
    assert whole.id != final.response.id and whole.output[0].id != final.response.output[0].id


def test_responses_stream_cut_by_max_output_tokens_ends_with_response_incomplete():
    body = {"model": "m", "input": "x", "max_output_tokens": 3, "stream": True}
    events = named_events(raw_stream(post("/responses", body)))
    names = [name for name, _ in events]
    assert names.count("response.output_text.delta") == 3
    assert names[-1] == "response.incomplete" and "response.completed" not in names
    final = RESPONSE_EVENT.validate_python(events[-1][1])
    assert final.response.status == "incomplete"
    assert final.response.incomplete_details.reason == "max_output_tokens"
    assert final.response.output[0].status == "incomplete"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [1]}, "input"),
        ({"model": "m", "input": "x", "instructions": 3}, "instructions"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "max_output_tokens": "9"}, "max_output_tokens"),
        ({"model": "m", "input": "x", "temperature": 3}, "temperature"),
        ({"model": "m", "input": "x", "metadata": {"a": 1}}, "metadata"),
    ],
)
def test_responses_bad_requests_are_openai_shaped_400s(body, param):
    r = post("/responses", body)
    assert r.status == 400
    error = json_of(r)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert param in error["message"]


def test_responses_null_optional_fields_take_their_defaults():
    body = {"model": "m", "input": "x", "temperature": None, "metadata": None}
    body |= {"instructions": None, "max_output_tokens": None}
    resp = Response.model_validate(json_of(post("/responses", body)))
    assert resp.status == "completed" and resp.temperature == 1.0 and resp.metadata == {}


def test_responses_mock_status_model_answers_openai_errors():
    r = post("/responses", {"model": "mock-status-429", "input": "x"})
    assert r.status == 429 and json_of(r)["error"]["type"] == "mock_error"


# ---------------------------------------------------------------- /messages


def test_messages_json_is_a_message_the_sdk_model_accepts():
    body = {"model": "claude-mock", "max_tokens": 100, "messages": MESSAGES, "system": "Be brief."}
    msg = Message.model_validate(json_of(post("/messages", body)))
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_mock")
    assert msg.model == "claude-mock"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    [block] = msg.content
    assert block.type == "text" and len(block.text.split()) == DEFAULT_COMPLETION_TOKENS
    assert msg.usage.input_tokens == 4 + 2 + 3
    assert msg.usage.output_tokens == DEFAULT_COMPLETION_TOKENS
    assert msg.usage.cache_creation_input_tokens == msg.usage.cache_read_input_tokens == 0


def test_messages_max_tokens_cuts_the_answer_with_stop_reason_max_tokens():
    body = {"model": "m", "max_tokens": 4, "messages": MESSAGES}
    msg = Message.model_validate(json_of(post("/messages", body)))
    assert msg.stop_reason == "max_tokens"
    assert len(msg.content[0].text.split()) == msg.usage.output_tokens == 4


def test_messages_stream_is_the_documented_sequence_and_matches_the_json_answer():
    body = {"model": "m", "max_tokens": 1024, "messages": MESSAGES, "system": "s"}
    raw = raw_stream(post("/messages", {**body, "stream": True}))
    assert b"[DONE]" not in raw
    events = named_events(raw)
    assert [name for name, _ in events] == MESSAGES_SEQUENCE
    parsed = [MESSAGE_EVENT.validate_python(obj) for name, obj in events if name != "ping"]
    start = parsed[0]
    assert start.type == "message_start"
    assert start.message.content == [] and start.message.stop_reason is None
    text = "".join(e.delta.text for e in parsed if e.type == "content_block_delta")
    delta = parsed[-2]
    assert delta.type == "message_delta" and delta.delta.stop_reason == "end_turn"
    whole = Message.model_validate(json_of(post("/messages", body)))
    assert whole.content[0].text == text and whole.id == start.message.id
    assert start.message.usage.input_tokens == whole.usage.input_tokens
    assert delta.usage.output_tokens == whole.usage.output_tokens == DEFAULT_COMPLETION_TOKENS


def test_messages_stream_cut_by_max_tokens():
    body = {"model": "m", "max_tokens": 2, "messages": MESSAGES, "stream": True}
    events = named_events(raw_stream(post("/messages", body)))
    assert [n for n, _ in events].count("content_block_delta") == 2
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2][1]["usage"]["output_tokens"] == 2
    assert events[-1][0] == "message_stop"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m", "messages": MESSAGES}, "max_tokens: Field required"),
        ({"model": "m", "messages": MESSAGES, "max_tokens": 0}, "max_tokens: "),
        ({"model": "m", "messages": MESSAGES, "max_tokens": True}, "max_tokens: "),
        ({"model": "m", "max_tokens": 5}, "messages: Field required"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages: "),
        ({"model": "m", "max_tokens": 5, "messages": "hi"}, "messages: "),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
         "messages.0.role: "),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}, "messages.0.content: "),
        ({"model": "m", "max_tokens": 5, "messages": MESSAGES, "system": 1}, "system: "),
        ({"max_tokens": 5, "messages": MESSAGES}, "model: Field required"),
    ],
)  # fmt: skip
def test_messages_bad_requests_are_anthropic_shaped_400s(body, message):
    r = post("/messages", body)
    assert r.status == 400
    got = json_of(r)
    assert got["type"] == "error" and got["request_id"].startswith("req_")
    assert got["error"]["type"] == "invalid_request_error"
    assert got["error"]["message"].startswith(message)


def test_messages_not_json_and_wrong_method_are_anthropic_shaped():
    r = reply("POST", "/messages", b"{nope")
    assert r.status == 400 and json_of(r)["error"]["type"] == "invalid_request_error"
    r = reply("GET", "/messages", b"")
    assert r.status == 405 and json_of(r)["type"] == "error"


@pytest.mark.parametrize(
    ("status", "type_"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_messages_mock_status_models_answer_anthropic_errors(status, type_):
    body = {"model": f"mock-status-{status}", "max_tokens": 5, "messages": MESSAGES}
    r = post("/messages", {**body, "stream": True})  # an error comes before any stream
    assert r.status == status and r.events is None
    got = json_of(r)
    assert got["type"] == "error" and got["error"]["type"] == type_
    assert str(status) in got["error"]["message"]


def test_count_tokens_counts_like_the_messages_usage():
    body = {"model": "m", "messages": MESSAGES, "system": "Be brief."}
    counted = MessageTokensCount.model_validate(json_of(post("/messages/count_tokens", body)))
    msg = Message.model_validate(json_of(post("/messages", {**body, "max_tokens": 9})))
    assert counted.input_tokens == msg.usage.input_tokens
    r = post("/messages/count_tokens", {"model": "m"})
    assert r.status == 400 and json_of(r)["error"]["message"] == "messages: Field required"


# ---------------------------------------------------------------- shared behaviour


def test_answers_are_deterministic_per_prompt_and_differ_between_prompts():
    def responses_text(**fields: Any) -> str:
        return Response.model_validate(
            json_of(post("/responses", {"model": "m", **fields}))
        ).output_text

    def messages_text(**fields: Any) -> str:
        body = {"model": "m", "max_tokens": 50, **fields}
        return Message.model_validate(json_of(post("/messages", body))).content[0].text

    assert responses_text(input="a") == responses_text(input="a")
    assert responses_text(input="a") != responses_text(input="b")
    assert responses_text(input="a") != responses_text(input="a", instructions="i")
    assert messages_text(messages=MESSAGES) == messages_text(messages=MESSAGES)
    assert messages_text(messages=MESSAGES) != messages_text(messages=MESSAGES, system="s")
    other = [{"role": "user", "content": "something else"}]
    assert messages_text(messages=MESSAGES) != messages_text(messages=other)


CUT_CASES = [
    (
        "/chat/completions",
        {"messages": MESSAGES, "stream_options": {"include_usage": True}},
        b"data: [DONE]",
    ),
    ("/completions", {"prompt": "p"}, b"data: [DONE]"),
    ("/responses", {"input": "x"}, b"response.output_text.done"),
    ("/messages", {"messages": MESSAGES, "max_tokens": 100}, b"content_block_stop"),
]


def _content_events(path: str, raw: bytes) -> list[str]:
    """The token-carrying events of a stream, as their text."""
    out = []
    for name, data in sse(raw):
        obj = orjson.loads(data)
        if path == "/chat/completions" and obj["choices"][0]["delta"].get("content"):
            out.append(obj["choices"][0]["delta"]["content"])
        elif path == "/completions":
            out.append(obj["choices"][0]["text"])
        elif name == "response.output_text.delta":
            out.append(obj["delta"])
        elif name == "content_block_delta":
            out.append(obj["delta"]["text"])
    return out


@pytest.mark.parametrize(("path", "fields", "marker"), CUT_CASES)
@pytest.mark.parametrize("n", [0, 3, 50])
def test_mock_cut_n_stops_every_stream_after_n_tokens_without_its_end(path, fields, marker, n):
    cut = raw_stream(post(path, {"model": f"mock-cut-{n}", **fields, "stream": True}))
    again = raw_stream(post(path, {"model": f"mock-cut-{n}", **fields, "stream": True}))
    # deterministic but for the clock: "created" is in whole seconds (two streams can straddle
    # one), and responses carry a timestamp of their own
    created = re.compile(rb'"created":\s*\d+')
    same = created.sub(b'"created":0', cut) == created.sub(b'"created":0', again)
    assert same or path == "/responses"
    assert marker not in cut
    for end in (b"[DONE]", b"response.completed", b"response.incomplete", b"message_stop"):
        assert end not in cut
    tokens = _content_events(path, cut)
    assert len(tokens) == min(n, DEFAULT_COMPLETION_TOKENS)
    # the same model answers a JSON request normally, and the stream was its prefix
    answer = json_of(post(path, {"model": f"mock-cut-{n}", **fields}))
    text = {
        "/chat/completions": lambda a: a["choices"][0]["message"]["content"],
        "/completions": lambda a: a["choices"][0]["text"],
        "/responses": lambda a: a["output"][0]["content"][0]["text"],
        "/messages": lambda a: a["content"][0]["text"],
    }[path](answer)
    assert len(text.split()) == DEFAULT_COMPLETION_TOKENS
    assert text.startswith("".join(tokens))


def test_the_same_streams_end_with_their_marker_without_the_cut_model():
    for path, fields, marker in CUT_CASES:
        raw = raw_stream(post(path, {"model": "mock-cut", **fields, "stream": True}))
        assert marker in raw, path


def test_output_tokens_knob_sets_the_natural_length_of_every_text_api():
    settings = MockSettings().from_headers({"x-mock-output-tokens": "30"})
    assert settings.output_tokens == 30
    assert MockSettings.from_url("mock://?output_tokens=7").output_tokens == 7
    resp = Response.model_validate(
        json_of(post("/responses", {"model": "m", "input": "x"}, settings))
    )
    assert resp.usage is not None and resp.usage.output_tokens == 30
    assert resp.status == "completed"
    body = {"model": "m", "max_tokens": 100, "messages": MESSAGES}
    msg = Message.model_validate(json_of(post("/messages", body, settings)))
    assert msg.usage.output_tokens == 30 and msg.stop_reason == "end_turn"
    chat = json_of(post("/chat/completions", {"model": "m", "messages": MESSAGES}, settings))
    assert chat["usage"]["completion_tokens"] == 30
    assert chat["choices"][0]["finish_reason"] == "stop"


def test_chat_length_semantics_are_unchanged_by_default():
    chat = json_of(post("/chat/completions", {"model": "m", "messages": MESSAGES}))
    assert chat["usage"]["completion_tokens"] == DEFAULT_COMPLETION_TOKENS
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 40}
    chat = json_of(post("/chat/completions", body))
    assert chat["usage"]["completion_tokens"] == 40
    assert chat["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "headers",
    [
        {"x-mock-output-tokens": "0"},
        {"x-mock-output-tokens": "1.5"},
        {"x-mock-output-tokens": "99999"},
        {"x-mock-ttft-ms": "-1"},
        {"x-mock-ttft-ms": "inf"},
        {"x-mock-tokens-per-s": "nan"},
        {"x-mock-latency-ms": "soon"},
    ],
)
def test_bad_knob_values_are_clear_errors(headers):
    with pytest.raises(ValueError, match="mock knob"):
        MockSettings().from_headers(headers)


def test_json_answers_take_what_their_stream_would():
    settings = MockSettings(latency_ms=100, ttft_ms=200, tokens_per_s=50)
    want = 0.1 + 0.2 + DEFAULT_COMPLETION_TOKENS / 50
    r = post("/responses", {"model": "m", "input": "x"}, settings)
    assert r.delay_s == pytest.approx(want)
    r = post("/messages", {"model": "m", "max_tokens": 5, "messages": MESSAGES}, settings)
    assert r.delay_s == pytest.approx(0.1 + 0.2 + 5 / 50)
    r = post(
        "/messages", {"model": "m", "max_tokens": 5, "messages": MESSAGES, "stream": True}, settings
    )
    assert r.delay_s == pytest.approx(0.1)  # a stream's headers wait for latency only


def test_bad_request_speaks_the_endpoints_error_shape():
    anthropic = json_of(bad_request("/messages", "nope"))
    assert anthropic["type"] == "error" and anthropic["error"]["message"] == "nope"
    openai = json_of(bad_request("/responses?x=1", "nope"))
    assert openai["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------- in process (mock://)


def test_in_process_transport_serves_responses_and_messages():
    transport = MockTransport(BackendConfig(name="m", url="mock://?output_tokens=5"))

    async def fetch(path: str, body: dict[str, Any], headers: list[tuple[str, str]]) -> Any:
        resp = await transport.request("POST", "mock:" + path, headers, orjson.dumps(body))
        try:
            data = b"".join([c async for c in resp.aiter_raw()])
        finally:
            await resp.aclose()
        return resp.status, dict(resp.headers), data

    async def main() -> None:
        status, headers, data = await fetch(
            "/messages", {"model": "m", "max_tokens": 9, "messages": MESSAGES, "stream": True}, []
        )
        assert status == 200 and headers[b"content-type"] == b"text/event-stream"
        names = [n for n, _ in named_events(data)]
        assert names.count("content_block_delta") == 5 and names[-1] == "message_stop"
        status, _, data = await fetch("/responses", {"model": "m", "input": "x"}, [])
        assert status == 200
        assert Response.model_validate(orjson.loads(data)).usage.output_tokens == 5
        status, _, data = await fetch("/messages", {}, [("X-Mock-TTFT-ms", "-5")])
        assert status == 400 and orjson.loads(data)["type"] == "error"

    asyncio.run(main())
