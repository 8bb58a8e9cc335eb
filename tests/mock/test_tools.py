"""The mock's tool calls and structured outputs, per API, in process.

Every answer and stream event is validated with the pydantic models of the official ``openai``
and ``anthropic`` SDKs; tool arguments and JSON answers with the pydantic model whose schema the
request carried.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.lib._pydantic import to_strict_json_schema
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from gateway.mock.tools import Turn, chat_turn, messages_turn, responses_turn
from tests.mock.test_engine import json_of, named_events, post, raw_stream, sse

RESPONSE_EVENT = TypeAdapter(ResponseStreamEvent)
MESSAGE_EVENT = TypeAdapter(RawMessageStreamEvent)
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Weather(BaseModel):
    city: str
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)
    hourly: bool


class Forecast(BaseModel):
    summary: str
    temperatures: list[float]


WEATHER = to_strict_json_schema(Weather)
FORECAST = to_strict_json_schema(Forecast)
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
RESPONSES_TOOLS = [
    {"type": "web_search"},  # not a function: never called by the mock
    {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True},
]
MESSAGES_TOOLS = [
    {"type": "web_search_20250305", "name": "web_search"},  # a server tool: no input_schema
    {"name": "get_weather", "description": "d", "input_schema": WEATHER},
]


# ---------------------------------------------------------------- which turn


def test_turns_follow_the_conversation_and_the_tool_choice():
    assert chat_turn({"messages": ASK}) is None
    assert chat_turn({"messages": ASK, "tools": CHAT_TOOLS}) == Turn(call=("get_weather", WEATHER))
    named = {"type": "function", "function": {"name": "get_time"}}
    turn = chat_turn({"messages": ASK, "tools": CHAT_TOOLS, "tool_choice": named})
    assert turn is not None and turn.call is not None and turn.call[0] == "get_time"
    assert chat_turn({"messages": ASK, "tools": CHAT_TOOLS, "tool_choice": "none"}) is None
    fmt = {"type": "json_schema", "json_schema": {"name": "f", "schema": FORECAST}}
    assert chat_turn({"messages": ASK, "response_format": fmt}) == Turn(schema=FORECAST)
    with pytest.raises(ValueError, match="nope"):
        chat_turn({"messages": ASK, "tools": CHAT_TOOLS, "tool_choice": {"function": {}} | {
            "type": "function", "function": {"name": "nope"}}})  # fmt: skip
    assert responses_turn({"input": "x", "tools": RESPONSES_TOOLS[:1]}) is None
    auto = {"type": "auto"}
    assert messages_turn({"messages": ASK, "tools": MESSAGES_TOOLS, "tool_choice": auto}) == Turn(
        call=("get_weather", WEATHER)
    )
    none = {"type": "none"}
    assert messages_turn({"messages": ASK, "tools": MESSAGES_TOOLS, "tool_choice": none}) is None


def test_an_mcp_tool_is_called_before_the_others():
    """Agent CLIs offer their own tools first; the mock calls one of their MCP servers' tools:
    ``mcp__{server}__{tool}`` (Claude Code) or a function of a ``mcp__{server}`` namespace
    (Codex, Responses)."""
    mcp = {"name": "mcp__gw__echo", "input_schema": {"type": "object"}}
    shell = {"name": "Bash", "input_schema": {"type": "object"}}
    turn = messages_turn({"messages": ASK, "tools": [shell, mcp]})
    assert turn == Turn(call=("mcp__gw__echo", {"type": "object"}))
    chat_mcp = {"type": "function", "function": {"name": "mcp__gw__echo"}}
    turn = chat_turn({"messages": ASK, "tools": [*CHAT_TOOLS, chat_mcp]})
    assert turn is not None and turn.call is not None and turn.call[0] == "mcp__gw__echo"
    echo = {"type": "function", "name": "builtin__echo", "parameters": {"type": "object"}}
    namespace = {"type": "namespace", "name": "mcp__gw", "tools": ["odd", echo]}
    deeper = {"type": "namespace", "name": "outer", "tools": [namespace]}  # not nested twice
    empty = {"type": "namespace", "name": "mcp__empty", "tools": "none"}
    tools = [*RESPONSES_TOOLS, {"type": "namespace"}, empty, deeper, namespace]
    turn = responses_turn({"input": "x", "tools": tools})
    assert turn == Turn(call=("builtin__echo", {"type": "object"}), namespace="mcp__gw")
    named = {"type": "function", "name": "get_weather"}
    turn = responses_turn({"input": "x", "tools": tools, "tool_choice": named})
    assert turn == Turn(call=("get_weather", WEATHER))  # tool_choice still wins
    assert responses_turn({"input": "x", "tools": RESPONSES_TOOLS}) == Turn(
        call=("get_weather", WEATHER)
    )


def test_parallel_tool_results_are_all_mentioned_by_name():
    calls = [
        {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "a", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "noon"}]},
    ]
    turn = chat_turn({"messages": messages, "tools": CHAT_TOOLS})
    assert turn == Turn(
        results="The get_weather tool returned: Sunny The get_time tool returned: noon"
    )


# ---------------------------------------------------------------- chat/completions


def chat_call(body: dict[str, Any]) -> tuple[ChatCompletion, Any]:
    answer = ChatCompletion.model_validate(json_of(post("/chat/completions", body)))
    [choice] = answer.choices
    [call] = choice.message.tool_calls or []
    return answer, call


def test_chat_with_tools_answers_one_tool_call_with_arguments_that_fit_the_schema():
    answer, call = chat_call({"model": "m", "messages": ASK, "tools": CHAT_TOOLS})
    assert answer.choices[0].finish_reason == "tool_calls"
    assert answer.choices[0].message.content is None
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = Weather.model_validate_json(call.function.arguments)
    assert args.unit == "celsius" and 1 <= args.days <= 7 and args.hourly is True
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    again = chat_call({"model": "m", "messages": ASK, "tools": CHAT_TOOLS})[1]
    assert again.function.arguments == call.function.arguments  # deterministic per prompt
    named = {"type": "function", "function": {"name": "get_time"}}
    _, other = chat_call({"model": "m", "messages": ASK, "tools": CHAT_TOOLS, "tool_choice": named})
    assert other.function.name == "get_time" and orjson.loads(other.function.arguments) == {}


def test_chat_tool_choice_none_answers_text_and_an_unknown_name_is_a_400():
    body = {"model": "m", "messages": ASK, "tools": CHAT_TOOLS, "tool_choice": "none"}
    answer = ChatCompletion.model_validate(json_of(post("/chat/completions", body)))
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    unknown = {"type": "function", "function": {"name": "nope"}}
    r = post("/chat/completions", {**body, "tool_choice": unknown})
    assert r.status == 400 and json_of(r)["error"]["param"] == "tool_choice"


def after_the_call(call: Any) -> list[dict[str, Any]]:
    return [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 22 C"},
    ]


def test_chat_after_a_tool_result_answers_text_that_mentions_it():
    _, call = chat_call({"model": "m", "messages": ASK, "tools": CHAT_TOOLS})
    body = {"model": "m", "messages": after_the_call(call), "tools": CHAT_TOOLS}
    answer = ChatCompletion.model_validate(json_of(post("/chat/completions", body)))
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "stop" and not message.tool_calls
    assert message.content == "The get_weather tool returned: Sunny, 22 C"
    short = ChatCompletion.model_validate(
        json_of(post("/chat/completions", body | {"max_tokens": 2}))
    )
    assert short.choices[0].finish_reason == "length"
    assert short.choices[0].message.content == "The get_weather"


def chat_chunks(raw: bytes) -> list[ChatCompletionChunk]:
    events = sse(raw)
    assert events[-1] == (None, "[DONE]")
    return [ChatCompletionChunk.model_validate_json(data) for _, data in events[:-1]]


def test_chat_stream_sends_the_tool_call_as_openai_does():
    body = {"model": "m", "messages": ASK, "tools": CHAT_TOOLS, "max_tokens": 3}
    _, want = chat_call(body)  # a tool call is never cut by max_tokens
    chunks = chat_chunks(raw_stream(post("/chat/completions", {**body, "stream": True})))
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content is None
    [head] = first.tool_calls or []
    assert head.index == 0 and head.id == want.id and head.type == "function"
    assert head.function is not None and head.function.name == want.function.name
    assert head.function.arguments == ""
    middle = [c.choices[0].delta.tool_calls for c in chunks[1:-1]]
    assert len(middle) > 3 and all(tc and tc[0].index == 0 and tc[0].id is None for tc in middle)
    assert "".join(tc[0].function.arguments for tc in middle) == want.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_chat_response_format_json_schema_and_json_object_answer_json():
    fmt = {"type": "json_schema", "json_schema": {"name": "f", "schema": FORECAST, "strict": True}}
    body = {"model": "m", "messages": ASK, "response_format": fmt}
    answer = ChatCompletion.model_validate(json_of(post("/chat/completions", body)))
    assert answer.choices[0].finish_reason == "stop"
    forecast = Forecast.model_validate_json(answer.choices[0].message.content or "")
    assert forecast.temperatures and forecast.summary
    chunks = chat_chunks(raw_stream(post("/chat/completions", {**body, "stream": True})))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == answer.choices[0].message.content
    body["response_format"] = {"type": "json_object"}
    answer = ChatCompletion.model_validate(json_of(post("/chat/completions", body)))
    assert isinstance(orjson.loads(answer.choices[0].message.content or ""), dict)


def test_chat_json_answer_after_a_tool_result_carries_the_result():
    _, call = chat_call({"model": "m", "messages": ASK, "tools": CHAT_TOOLS})
    fmt = {"type": "json_schema", "json_schema": {"name": "f", "schema": FORECAST}}
    body = {"model": "m", "messages": after_the_call(call), "response_format": fmt}
    answer = ChatCompletion.model_validate(json_of(post("/chat/completions", body)))
    forecast = Forecast.model_validate_json(answer.choices[0].message.content or "")
    assert "Sunny, 22 C" in forecast.summary


def test_mock_cut_cuts_a_tool_call_stream_too():
    body = {"model": "mock-cut-2", "messages": ASK, "tools": CHAT_TOOLS, "stream": True}
    raw = raw_stream(post("/chat/completions", body))
    assert b'"name":"get_weather"' in raw
    assert b"[DONE]" not in raw and b'"finish_reason":"tool_calls"' not in raw
    assert raw.count(b"data: ") == 3  # the head chunk and two argument pieces


# ---------------------------------------------------------------- /responses


def test_responses_with_a_function_tool_answer_a_function_call():
    body = {"model": "m", "input": "weather in Paris?", "tools": RESPONSES_TOOLS}
    resp = Response.model_validate(json_of(post("/responses", body)))
    assert resp.status == "completed"
    [item] = resp.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and item.id is not None and item.status == "completed"
    Weather.model_validate_json(item.arguments)
    assert resp.usage is not None and resp.usage.output_tokens > 0
    none = Response.model_validate(json_of(post("/responses", {**body, "tool_choice": "none"})))
    assert none.output[0].type == "message"
    bad = post("/responses", {**body, "tool_choice": {"type": "function", "name": "x"}})
    assert bad.status == 400 and json_of(bad)["error"]["param"] == "tool_choice"
    echo = {"type": "function", "name": "builtin__echo", "parameters": {"type": "object"}}
    namespaced = {"type": "namespace", "name": "mcp__gw", "tools": [echo]}
    body = {**body, "tools": [*RESPONSES_TOOLS, namespaced]}
    [item] = json_of(post("/responses", body))["output"]  # (the SDK's types know no namespace)
    assert item["type"] == "function_call" and item["name"] == "builtin__echo"
    assert item["namespace"] == "mcp__gw"  # Codex routes the call by it


def test_responses_function_call_stream_is_the_real_event_sequence():
    body = {"model": "m", "input": "weather in Paris?", "tools": RESPONSES_TOOLS, "stream": True}
    events = named_events(raw_stream(post("/responses", body)))
    names = [n for n, _ in events]
    deltas = names.count("response.function_call_arguments.delta")
    assert deltas > 3
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    parsed = [RESPONSE_EVENT.validate_python(obj) for _, obj in events]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    added, done, final = parsed[2], parsed[-3], parsed[-1]
    assert added.item.type == "function_call" and added.item.arguments == ""
    assert added.item.status == "in_progress" and added.item.name == "get_weather"
    joined = "".join(e.delta for e in parsed if e.type == "response.function_call_arguments.delta")
    assert done.type == "response.function_call_arguments.done" and done.arguments == joined
    assert {e.item_id for e in parsed if hasattr(e, "item_id")} == {added.item.id}
    assert final.response.output[0].arguments == joined
    assert final.response.output[0].call_id == added.item.call_id
    Weather.model_validate_json(joined)


def test_responses_after_function_call_output_answer_text_that_mentions_it():
    first = Response.model_validate(
        json_of(post("/responses", {"model": "m", "input": "weather?", "tools": RESPONSES_TOOLS}))
    )
    call = first.output[0].model_dump(exclude_none=True)
    items = [
        {"role": "user", "content": "weather?"},
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "Rain"},
    ]
    body = {"model": "m", "input": items, "tools": RESPONSES_TOOLS}
    resp = Response.model_validate(json_of(post("/responses", body)))
    assert resp.output_text == "The get_weather tool returned: Rain"
    raw = raw_stream(post("/responses", {**body, "stream": True}))
    final = RESPONSE_EVENT.validate_python(named_events(raw)[-1][1])
    assert final.type == "response.completed"
    assert final.response.output_text == resp.output_text


def test_responses_text_format_json_schema_answers_json():
    fmt = {"type": "json_schema", "name": "forecast", "schema": FORECAST, "strict": True}
    body = {"model": "m", "input": "forecast?", "text": {"format": fmt}}
    resp = Response.model_validate(json_of(post("/responses", body)))
    Forecast.model_validate_json(resp.output_text)
    obj = {"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}
    resp = Response.model_validate(json_of(post("/responses", obj)))
    assert isinstance(orjson.loads(resp.output_text), dict)


def test_responses_ids_are_unique_per_response():
    body = {"model": "m", "input": "same prompt", "tools": RESPONSES_TOOLS}
    one, two = (Response.model_validate(json_of(post("/responses", body))) for _ in range(2))
    assert one.id.startswith("resp_") and two.id.startswith("resp_") and one.id != two.id
    assert one.output[0].id != two.output[0].id
    assert one.output[0].call_id != two.output[0].call_id
    text = [Response.model_validate(json_of(post("/responses", {"model": "m", "input": "a"})))]
    text.append(Response.model_validate(json_of(post("/responses", {"model": "m", "input": "a"}))))
    assert text[0].id != text[1].id and text[0].output[0].id != text[1].output[0].id
    assert text[0].output_text == text[1].output_text  # the text stays deterministic


# ---------------------------------------------------------------- /messages


def test_messages_with_tools_answer_tool_use():
    body = {"model": "m", "max_tokens": 5, "messages": ASK, "tools": MESSAGES_TOOLS}
    msg = Message.model_validate(json_of(post("/messages", body)))  # max_tokens never cuts it
    assert msg.stop_reason == "tool_use"
    [block] = msg.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.id.startswith("toolu_")
    Weather.model_validate(block.input)
    assert msg.usage.output_tokens > 0


def test_messages_tool_use_stream_sends_input_json_deltas():
    body = {"model": "m", "max_tokens": 100, "messages": ASK, "tools": MESSAGES_TOOLS}
    want = Message.model_validate(json_of(post("/messages", body))).content[0]
    events = named_events(raw_stream(post("/messages", {**body, "stream": True})))
    parsed = [MESSAGE_EVENT.validate_python(o) for n, o in events if n != "ping"]
    start = parsed[1]
    assert start.type == "content_block_start" and start.content_block.type == "tool_use"
    assert start.content_block.name == "get_weather" and start.content_block.input == {}
    assert start.content_block.id == want.id
    deltas = [e.delta for e in parsed if e.type == "content_block_delta"]
    assert all(d.type == "input_json_delta" for d in deltas) and len(deltas) > 3
    assert orjson.loads("".join(d.partial_json for d in deltas)) == want.input
    delta = parsed[-2]
    assert delta.type == "message_delta" and delta.delta.stop_reason == "tool_use"
    assert delta.usage.output_tokens == len(deltas)


def test_messages_after_tool_result_answer_text_that_mentions_it():
    body = {"model": "m", "max_tokens": 100, "messages": ASK, "tools": MESSAGES_TOOLS}
    use = Message.model_validate(json_of(post("/messages", body))).content[0]
    result = {
        "type": "tool_result",
        "tool_use_id": use.id,
        "content": [{"type": "text", "text": "Windy"}],
    }
    messages = [
        *ASK,
        {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [result]},
    ]
    msg = Message.model_validate(json_of(post("/messages", {**body, "messages": messages})))
    assert msg.stop_reason == "end_turn"
    assert msg.content[0].type == "text"
    assert msg.content[0].text == "The get_weather tool returned: Windy"


def test_messages_output_config_json_schema_answers_json():
    fmt = {"type": "json_schema", "schema": FORECAST}
    body = {"model": "m", "max_tokens": 100, "messages": ASK, "output_config": {"format": fmt}}
    msg = Message.model_validate(json_of(post("/messages", body)))
    assert msg.content[0].type == "text"
    Forecast.model_validate_json(msg.content[0].text)
