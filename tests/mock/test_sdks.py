"""``gateway mock-upstream`` (a separate process) driven by the official openai and anthropic SDKs.

The Responses API through ``openai.OpenAI(base_url=…/v1)``, the Messages API through
``anthropic.Anthropic(base_url=<root>)`` (the SDK appends ``/v1/messages`` itself).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from gateway.mock.engine import DEFAULT_COMPLETION_TOKENS
from tests.support import Process, anthropic_client, free_port, gateway_cli, openai_client

MESSAGES = [{"role": "user", "content": "Tell me about gateways"}]


@pytest.fixture
def oai(mock_upstream: Process) -> openai.OpenAI:
    return openai_client(mock_upstream.url + "/v1", "x")


@pytest.fixture
def claude(mock_upstream: Process) -> anthropic.Anthropic:
    return anthropic_client(mock_upstream.url, "x")


def raw_sse(url: str, body: dict[str, Any]) -> tuple[str, bytes]:
    """POST and read the whole body: (content type, bytes as the server sent them)."""
    req = urllib.request.Request(url, orjson.dumps(body), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.headers["content-type"], resp.read()


def event_names(raw: bytes) -> list[str]:
    return [line[7:] for line in raw.decode().split("\n") if line.startswith("event: ")]


# ---------------------------------------------------------------- openai: /v1/responses


def test_responses_create_json(oai):
    resp = oai.responses.create(
        model="mock-gpt-4o", input="Tell me about gateways", instructions="Be brief."
    )
    assert resp.object == "response" and resp.status == "completed"
    assert resp.model == "mock-gpt-4o" and resp.instructions == "Be brief."
    assert len(resp.output_text.split()) == DEFAULT_COMPLETION_TOKENS
    assert resp.usage is not None and resp.usage.output_tokens == DEFAULT_COMPLETION_TOKENS
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    again = oai.responses.create(
        model="mock-gpt-4o", input="Tell me about gateways", instructions="Be brief."
    )
    assert again.output_text == resp.output_text  # deterministic per prompt


def test_responses_create_input_items_and_max_output_tokens_incomplete(oai):
    resp = oai.responses.create(
        model="m",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        max_output_tokens=4,
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert len(resp.output_text.split()) == 4 and resp.usage.output_tokens == 4


def test_responses_create_stream_events_join_to_the_final_response(oai):
    events = list(oai.responses.create(model="m", input="Tell me about gateways", stream=True))
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == DEFAULT_COMPLETION_TOKENS
    final = events[-1].response
    assert final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens == len(deltas)
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_stream_helper_get_final_response(oai):
    with oai.responses.stream(model="m", input="Tell me about gateways") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(deltas) and deltas
    assert final.usage is not None and final.usage.output_tokens == len(deltas)


def test_responses_errors_raise_the_openai_exceptions(oai):
    with pytest.raises(openai.BadRequestError) as bad:
        oai.responses.create(model="m", input=[])
    assert bad.value.body["param"] == "input"
    with pytest.raises(openai.RateLimitError):
        oai.responses.create(model="mock-status-429", input="x")
    with pytest.raises(openai.InternalServerError):
        oai.responses.create(model="mock-status-503", input="x", stream=True)


def test_responses_knob_headers_through_the_sdk(oai):
    resp = oai.responses.create(model="m", input="x", extra_headers={"x-mock-output-tokens": "40"})
    assert resp.usage is not None and resp.usage.output_tokens == 40
    assert resp.status == "completed"


# ---------------------------------------------------------------- anthropic: /v1/messages


def test_messages_create_json(claude):
    msg = claude.messages.create(
        model="claude-mock", max_tokens=1024, messages=MESSAGES, system="Be brief."
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "claude-mock"
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.content[0].type == "text"
    assert len(msg.content[0].text.split()) == msg.usage.output_tokens
    assert msg.usage.output_tokens == DEFAULT_COMPLETION_TOKENS and msg.usage.input_tokens > 0
    short = claude.messages.create(model="claude-mock", max_tokens=3, messages=MESSAGES)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_messages_create_stream_raw_events(claude):
    events = list(
        claude.messages.create(model="m", max_tokens=1024, messages=MESSAGES, stream=True)
    )
    types = [e.type for e in events]  # the SDK skips ping
    assert types == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * DEFAULT_COMPLETION_TOKENS,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    msg = claude.messages.create(model="m", max_tokens=1024, messages=MESSAGES)
    assert text == msg.content[0].text
    assert events[0].message.usage.input_tokens == msg.usage.input_tokens
    assert events[-2].delta.stop_reason == "end_turn"
    assert events[-2].usage.output_tokens == msg.usage.output_tokens


def test_messages_stream_helper_text_stream_and_final_message(claude):
    with claude.messages.stream(model="m", max_tokens=5, messages=MESSAGES) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) == 5
    assert final.content[0].text == "".join(pieces)
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 5 and final.usage.input_tokens > 0


def test_messages_count_tokens_matches_the_usage(claude):
    counted = claude.messages.count_tokens(model="m", messages=MESSAGES, system="Be brief.")
    msg = claude.messages.create(model="m", max_tokens=9, messages=MESSAGES, system="Be brief.")
    assert counted.input_tokens == msg.usage.input_tokens


def test_missing_max_tokens_is_an_anthropic_bad_request(claude):
    # the SDK's typed create() insists on max_tokens; its low-level post sends what we say
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.post(
            "/v1/messages",
            body={"model": "m", "messages": MESSAGES},
            cast_to=anthropic.types.Message,
        )
    assert bad.value.status_code == 400
    assert bad.value.body["type"] == "error"
    assert bad.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "max_tokens: Field required",
    }


@pytest.mark.parametrize(
    ("status", "exc", "type_"),
    [
        (400, anthropic.BadRequestError, "invalid_request_error"),
        (401, anthropic.AuthenticationError, "authentication_error"),
        (404, anthropic.NotFoundError, "not_found_error"),
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
def test_mock_status_models_raise_the_anthropic_exceptions(claude, status, exc, type_):
    for stream in (False, True):
        with pytest.raises(exc) as raised:
            claude.messages.create(
                model=f"mock-status-{status}", max_tokens=5, messages=MESSAGES, stream=stream
            )
        assert raised.value.status_code == status
        assert raised.value.body["error"]["type"] == type_


# ---------------------------------------------------------------- raw SSE: framing and the cut knob


def test_raw_streams_have_event_lines_and_no_done(mock_upstream):
    body = {"model": "m", "input": "x", "stream": True}
    ctype, raw = raw_sse(mock_upstream.url + "/v1/responses", body)
    assert ctype.startswith("text/event-stream")
    assert b"[DONE]" not in raw and raw.endswith(b"\n\n")
    assert event_names(raw)[-1] == "response.completed"
    assert raw.count(b"\nevent: ") + 1 == raw.count(b"data: ")  # one event: line per event
    body = {"model": "m", "max_tokens": 9, "stream": True, "messages": MESSAGES}
    ctype, raw = raw_sse(mock_upstream.url + "/v1/messages", body)
    assert ctype.startswith("text/event-stream")
    assert b"[DONE]" not in raw and event_names(raw)[-1] == "message_stop"


CUT = {"model": "mock-cut-2", "stream": True}


@pytest.mark.parametrize(
    ("path", "body", "last"),
    [
        ("/v1/chat/completions", {**CUT, "messages": MESSAGES}, None),
        ("/v1/responses", {**CUT, "input": "x"}, "response.output_text.delta"),
        ("/v1/messages", {**CUT, "max_tokens": 50, "messages": MESSAGES}, "content_block_delta"),
    ],
)
def test_mock_cut_streams_end_after_n_tokens_without_their_end_event(
    mock_upstream, path, body, last
):
    _, raw = raw_sse(mock_upstream.url + path, body)
    assert raw.endswith(b"\n\n")  # whole events, then the body just ends
    for end in (b"[DONE]", b'finish_reason":"stop', b"response.completed", b"message_stop"):
        assert end not in raw
    if last is None:
        assert raw.count(b"data: ") == 3  # the role chunk and two tokens
    else:
        names = event_names(raw)
        assert names[-1] == last and names.count(last) == 2


def test_a_cut_responses_stream_leaves_the_sdk_helper_without_a_final_response(oai):
    with oai.responses.stream(model="mock-cut-3", input="x") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        with pytest.raises(RuntimeError, match=r"response\.completed"):
            stream.get_final_response()
    assert len(deltas) == 3


# ---------------------------------------------------------------- pacing knobs


@pytest.fixture(scope="module")
def paced_upstream() -> Iterator[Process]:
    port = free_port()
    proc = Process(
        gateway_cli(
            "mock-upstream", "--port", str(port), "--ttft-ms", "150", "--tokens-per-s", "25"
        ),
        port,
    )
    yield proc
    proc.stop()


TOKENS = 6
PACE_S = 1 / 25


def _spread_ok(start: float, stamps: list[float]) -> None:
    """The knobs' behaviour, with generous margins (lower bounds only, never a speed limit)."""
    assert len(stamps) == TOKENS
    assert stamps[0] - start >= 0.15 * 0.8  # the first token waited for the TTFT
    assert stamps[-1] - stamps[0] >= (TOKENS - 1) * PACE_S * 0.7  # the rest are paced, not bunched


def test_responses_stream_is_paced_by_the_knobs(paced_upstream):
    client = openai_client(paced_upstream.url + "/v1", "x")
    start = time.monotonic()
    stamps = [
        time.monotonic()
        for e in client.responses.create(
            model="m",
            input="x",
            stream=True,
            extra_headers={"x-mock-output-tokens": str(TOKENS)},
        )
        if e.type == "response.output_text.delta"
    ]
    _spread_ok(start, stamps)


def test_messages_stream_is_paced_by_the_knobs(paced_upstream):
    client = anthropic_client(paced_upstream.url, "x")
    start = time.monotonic()
    with client.messages.stream(model="m", max_tokens=TOKENS, messages=MESSAGES) as stream:
        stamps = [time.monotonic() for _ in stream.text_stream]
    _spread_ok(start, stamps)


def test_json_answers_wait_for_what_the_stream_would_take(paced_upstream):
    client = anthropic_client(paced_upstream.url, "x")
    start = time.monotonic()
    msg = client.messages.create(model="m", max_tokens=TOKENS, messages=MESSAGES)
    elapsed = time.monotonic() - start
    assert msg.usage.output_tokens == TOKENS
    assert elapsed >= (0.15 + TOKENS * PACE_S) * 0.8
