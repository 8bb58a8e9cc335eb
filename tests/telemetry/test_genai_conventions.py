"""What the LLM observability tools read (docs/spec.md §7): the GenAI conventions' usage, cost
and conversation, captured content (none, metadata, full; redacted, capped), OpenInference's
names, and the GenAI client metrics over OTLP — all decoded by the suite's real OTLP receiver."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import anthropic
import orjson
import pytest

from gateway.config import ConfigError, load_config
from tests.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.support import (
    LAST_CHUNK,
    SeenRequest,
    chat_chunk,
    chunk,
    gateway_config,
    http_response,
    openai_client,
    sse_head,
)

PRICES = '[[prices]]\nmodels = ["*"]\ninput = 2.0\noutput = 8.0\ncached_input = 1.0\n'
CHAT = {
    "id": "chatcmpl-u",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-answered",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "the answer"},
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 40},
        "completion_tokens_details": {"reasoning_tokens": 7},
    },
}
RESPONSE = {
    "id": "resp_u1",
    "object": "response",
    "created_at": 1,
    "model": "gpt-answered",
    "status": "completed",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 50,
        "output_tokens": 9,
        "total_tokens": 59,
        "input_tokens_details": {"cached_tokens": 30},
        "output_tokens_details": {"reasoning_tokens": 4},
    },
}
MESSAGE = {
    "id": "msg_u1",
    "type": "message",
    "role": "assistant",
    "model": "claude-answered",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "usage": {
        "input_tokens": 10,
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 5,
        "output_tokens": 4,
    },
}


async def _by_path(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
    """A provider of all three APIs, each answering with usage that has every part."""
    path = req.target.split("?")[0]
    body = RESPONSE if path.endswith("/responses") else MESSAGE if "messages" in path else CHAT
    writer.write(http_response(200, orjson.dumps(body)))
    return True


def _config(upstream_url: str, receiver: OTLPReceiver, tracing: str = "", extra: str = "") -> Any:
    return gateway_config(
        f"""
[[backends]]
name = "up"
url = "{upstream_url}"

[[routes]]
models = ["*"]
backends = ["up"]

[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
sample_ratio = 1.0
schedule_delay_ms = 50
{tracing}

{PRICES}
{extra}
"""
    )


def _spans(receiver: OTLPReceiver, path: str) -> tuple[ReceivedSpan, ReceivedSpan]:
    """The root of the last request to ``path`` and its answering CLIENT span."""
    name = f"POST {path}"
    spans = receiver.wait_for(
        lambda ss: any(
            s.name == name and any(c.parent_span_id == s.span_id and c.kind == "CLIENT" for c in ss)
            for s in ss
        )
    )
    root = [s for s in spans if s.name == name][-1]
    (client,) = [s for s in spans if s.parent_span_id == root.span_id and s.kind == "CLIENT"]
    return root, client


def test_usage_cost_and_conversation_follow_the_current_conventions(gateway, upstream, receiver):
    up = upstream(_by_path)
    gw = gateway(_config(up.url + "/v1", receiver))
    client = openai_client(gw.base_url)
    client.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}])
    root, span = _spans(receiver, "/v1/chat/completions")
    for s in (root, span):  # OpenAI: prompt_tokens_details, completion_tokens_details
        a = s.attributes
        assert a["gen_ai.usage.input_tokens"] == 100 and a["gen_ai.usage.output_tokens"] == 20
        assert a["gen_ai.usage.cache_read.input_tokens"] == 40
        assert a["gen_ai.usage.reasoning.output_tokens"] == 7
        assert "gen_ai.usage.cache_creation.input_tokens" not in a  # not reported
        # 60 fresh at 2.0, 40 cached at 1.0, 20 out at 8.0 per million
        assert a["gateway.cost_usd"] == pytest.approx((60 * 2 + 40 * 1 + 20 * 8) / 1e6)
        assert "gen_ai.conversation.id" not in a  # chat completions name none

    client.responses.create(model="gpt-x", input="hi", conversation="conv_abc123")
    root, span = _spans(receiver, "/v1/responses")
    for s in (root, span):  # Responses: input_tokens_details, output_tokens_details
        a = s.attributes
        assert a["gen_ai.conversation.id"] == "conv_abc123"
        assert a["gen_ai.usage.input_tokens"] == 50
        assert a["gen_ai.usage.cache_read.input_tokens"] == 30
        assert a["gen_ai.usage.reasoning.output_tokens"] == 4
    client.close()

    claude = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
    claude.messages.create(
        model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    claude.close()
    root, span = _spans(receiver, "/v1/messages")
    a = span.attributes  # Anthropic: the cache parts reported apart, summed into the input
    assert a["gen_ai.usage.input_tokens"] == 45
    assert a["gen_ai.usage.cache_read.input_tokens"] == 30
    assert a["gen_ai.usage.cache_creation.input_tokens"] == 5
    assert a["gen_ai.usage.output_tokens"] == 4 and "gateway.cost_usd" in a


MARKER = "PROMPT-MARKER"
SECRET = "sk-live-0123456789abcdef"


def _chat_with_everything(client: Any, marker: str, stream: bool) -> str:
    messages = [
        {"role": "system", "content": f"be brief {marker}"},
        {"role": "user", "content": f"say {marker} and keep {SECRET} quiet"},
    ]
    tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "d", "parameters": {}},
        }
    ]
    if not stream:
        answer = client.chat.completions.create(
            model="gpt-4o", messages=messages, tools=tools, tool_choice="none"
        )
        return str(answer.choices[0].message.content)
    parts = []
    for event in client.chat.completions.create(
        model="gpt-4o", messages=messages, tools=tools, tool_choice="none", stream=True
    ):
        if event.choices and event.choices[0].delta.content:
            parts.append(event.choices[0].delta.content)
    return "".join(parts)


MOCK = """
[[backends]]
name = "mock"
url = "mock://"

[[routes]]
models = ["*"]
backends = ["mock"]
"""


def _mock_config(receiver: OTLPReceiver, tracing: str) -> Any:
    return gateway_config(
        f"""{MOCK}
[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
schedule_delay_ms = 50
{tracing}
{PRICES}
"""
    )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["none", "metadata", "full"])
def test_content_capture_modes(gateway, receiver, mode, stream):
    marker = f"{MARKER}-{random.getrandbits(32):08x}"
    redact = 'redact = ["sk-live-[0-9a-f]+"]'
    gw = gateway(_mock_config(receiver, f'capture_content = "{mode}"\n{redact}'))
    client = openai_client(gw.base_url)
    completion = _chat_with_everything(client, marker, stream)
    client.close()
    root, span = _spans(receiver, "/v1/chat/completions")
    everything = json.dumps([[s.attributes, s.status_message] for s in (root, span)])
    assert SECRET not in everything  # never, whatever the mode
    a = span.attributes
    if mode == "none":
        assert marker not in everything and completion not in everything
        assert not any(k.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.system")) for k in a)
        return
    messages = json.loads(a["gen_ai.input.messages"])
    assert [m["role"] for m in messages] == ["system", "user"]  # history in order, system in it
    tools = json.loads(a["gen_ai.tool.definitions"])
    assert tools == [{"type": "function", "name": "get_weather"}]  # no description, no schema
    (output,) = json.loads(a["gen_ai.output.messages"])
    assert output["role"] == "assistant" and output["finish_reason"] == "stop"
    user_text = f"say {marker} and keep {SECRET} quiet"
    if mode == "metadata":  # shapes and sizes, never a character of text
        assert marker not in everything and completion not in everything
        assert messages[1]["parts"] == [{"type": "text", "size": len(user_text.encode())}]
        assert output["parts"] == [{"type": "text", "size": len(completion.encode())}]
        return
    assert messages[1]["parts"] == [
        {"type": "text", "content": f"say {marker} and keep [REDACTED] quiet"}
    ]
    # a stream's answer is assembled from the relayed events: what the client read
    assert output["parts"] == [{"type": "text", "content": completion}]
    assert "gateway.content.truncated" not in a


def test_captured_content_is_capped_and_stays_json(gateway, receiver):
    cap = 64
    gw = gateway(_mock_config(receiver, f'capture_content = "full"\ncapture_max_bytes = {cap}'))
    client = openai_client(gw.base_url)
    long = "é" * 500 + "END"
    many = [{"role": "user", "content": "x"} for _ in range(2000)]  # many tiny messages
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": long}])
    _, span = _spans(receiver, "/v1/chat/completions")
    a = span.attributes
    (message,) = json.loads(a["gen_ai.input.messages"])  # still valid JSON
    text = message["parts"][0]["content"]
    assert len(text.encode()) <= cap and "END" not in text and set(text) == {"é"}
    assert a["gateway.content.truncated"] is True
    receiver.clear()
    client.chat.completions.create(model="gpt-4o", messages=many)
    _, span = _spans(receiver, "/v1/chat/completions")
    listed = json.loads(span.attributes["gen_ai.input.messages"])
    assert 0 < len(listed) < 20  # the budget counts each message, not only text
    client.close()


def test_openinference_names_beside_the_genai_ones(gateway, upstream, receiver):
    up = upstream(_by_path)
    tracing = 'conventions = "openinference"\ncapture_content = "full"'
    gw = gateway(_config(up.url + "/v1", receiver, tracing))
    client = openai_client(gw.base_url)
    client.chat.completions.create(
        model="gpt-x",
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "question"}],
    )
    client.close()
    root, span = _spans(receiver, "/v1/chat/completions")
    a = span.attributes
    assert a["openinference.span.kind"] == "LLM"
    assert a["llm.model_name"] == "gpt-answered" and a["llm.provider"] == "openai"
    assert a["llm.token_count.prompt"] == 100 and a["llm.token_count.completion"] == 20
    assert a["llm.token_count.total"] == 120
    assert a["llm.token_count.prompt_details.cache_read"] == 40
    assert a["llm.token_count.completion_details.reasoning"] == 7
    assert a["llm.cost.total"] == pytest.approx(a["gateway.cost_usd"])
    assert a["llm.input_messages.0.message.role"] == "system"
    assert a["llm.input_messages.1.message.content"] == "question"
    assert a["llm.output_messages.0.message.content"] == "the answer"
    assert json.loads(a["input.value"])[1]["parts"][0]["content"] == "question"
    assert a["output.value"] == "the answer" and a["output.mime_type"] == "text/plain"
    # the contract's names stay
    assert a["gen_ai.usage.input_tokens"] == 100 and a["gen_ai.request.model"] == "gpt-x"
    assert root.attributes["openinference.span.kind"] == "CHAIN"


def test_capture_content_reads_its_boolean_form_and_checks_patterns():
    base = MOCK + "[tracing]\n"
    assert load_config(text=base + "capture_content = true").tracing.capture_content == "full"
    assert load_config(text=base + "capture_content = false").tracing.capture_content == "none"
    got = load_config(text=MOCK, env={"GATEWAY__TRACING__CAPTURE_CONTENT": "true"})
    assert got.tracing.capture_content == "full"
    meta = load_config(text=base + 'capture_content = "metadata"')
    assert meta.tracing.capture_content == "metadata"
    with pytest.raises(ConfigError) as info:
        load_config(text=base + 'capture_content = "some"\nredact = ["(unclosed", "a*"]')
    text = str(info.value)
    assert "tracing.capture_content" in text
    assert "tracing.redact[0]: not a regular expression" in text
    assert "tracing.redact[1]: must not match the empty string" in text


def _stream_upstream() -> Any:
    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        if b'"stream":true' not in req.body:
            writer.write(http_response(200, orjson.dumps(CHAT)))
            return True
        writer.write(sse_head())
        writer.write(chunk(chat_chunk("hel", model="gpt-answered")))
        writer.write(chunk(chat_chunk("lo", finish="stop", model="gpt-answered")))
        usage = {**CHAT, "object": "chat.completion.chunk", "choices": []}
        writer.write(chunk(b"data: " + orjson.dumps(usage) + b"\n\n"))
        writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
        return True

    return handler


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_genai_client_metrics_are_exported_over_otlp(gateway, upstream, protocol):
    kind = "grpc" if protocol == "grpc" else "http"
    with OTLPReceiver(kind) as receiver:
        up = upstream(_stream_upstream())
        tracing = f'protocol = "{protocol}"\nmetrics = true\nmetrics_interval_s = 0.2'
        gw = gateway(_config(up.url + "/v1", receiver, tracing))
        client = openai_client(gw.base_url)
        messages = [{"role": "user", "content": "hi"}]
        client.chat.completions.create(model="gpt-x", messages=messages)
        for _ in client.chat.completions.create(model="gpt-x", messages=messages, stream=True):
            pass
        client.close()
        points = receiver.wait_for_points(
            lambda ps: (
                any(p.name == "gen_ai.client.operation.duration" and p.count == 2 for p in ps)
                and any(p.name == "gen_ai.client.operation.time_to_first_chunk" for p in ps)
            )
        )
    latest = {(p.name, json.dumps(p.attributes, sort_keys=True)): p for p in points}
    duration = [p for (n, _), p in latest.items() if n == "gen_ai.client.operation.duration"]
    (d,) = duration
    assert d.unit == "s" and d.temporality == 2 and sum(d.bucket_counts) == d.count == 2
    assert d.explicit_bounds[:3] == [0.01, 0.02, 0.04] and d.explicit_bounds[-1] == 81.92
    assert d.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-x",
        "gen_ai.response.model": "gpt-answered",
        "server.address": "127.0.0.1",
        "server.port": up.port,
    }
    tokens = {
        p.attributes["gen_ai.token.type"]: p
        for (n, _), p in latest.items()
        if n == "gen_ai.client.token.usage"
    }
    assert tokens["input"].sum == 200 and tokens["output"].sum == 40  # two calls each
    assert tokens["input"].unit == "{token}" and tokens["input"].explicit_bounds[1] == 4
    (first,) = [p for (n, _), p in latest.items() if n.endswith("time_to_first_chunk")]
    assert first.count == 1  # the stream only
    assert len(d.resource["service.instance.id"]) == 32
