"""Tool calls and structured outputs on the embedded default, through the gateway, driven by
the official SDKs as agent frameworks drive them.

The openai SDK's ``parse`` helpers get parsed objects, its tool loops run (chat/completions and
Responses, JSON and streamed), the anthropic SDK gets ``tool_use`` and answers ``tool_result``;
``GET /v1/models`` names the models the README's examples use.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import anthropic
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support import GatewayServer, anthropic_client, openai_client

QUESTION = "What is the weather in Paris?"


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str
    unit: Literal["celsius", "fahrenheit"]


class Forecast(BaseModel):
    city: str
    days: int = Field(ge=1, le=10)
    temperatures: list[float]
    sunny: bool


def get_weather(city: str, unit: str) -> str:
    """The local tool of these loops: what it returns must come back in the final answer."""
    return f"It is 21 degrees {unit} and sunny in {city}"


@pytest.fixture
def oai(embedded: GatewayServer) -> openai.OpenAI:
    return openai_client(embedded.base_url, "x")


@pytest.fixture
def claude(embedded: GatewayServer) -> anthropic.Anthropic:
    return anthropic_client(embedded.url, "x")


def test_models_list_names_the_models_of_the_readme(oai):
    ids = {m.id for m in oai.models.list()}
    assert {"gpt-4o", "gpt-4o-mini", "claude-sonnet-4", "text-embedding-3-small"} <= ids
    emb = oai.embeddings.create(model="text-embedding-3-small", input="hi", dimensions=4)
    assert len(emb.data[0].embedding) == 4


# ---------------------------------------------------------------- chat/completions


def test_chat_parse_gets_a_parsed_pydantic_object(oai):
    done = oai.chat.completions.parse(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Forecast for Paris"}],
        response_format=Forecast,
    )
    parsed = done.choices[0].message.parsed
    assert isinstance(parsed, Forecast) and 1 <= parsed.days <= 10 and parsed.temperatures


def test_chat_tool_loop(oai):
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = oai.chat.completions.parse(model="gpt-4o", messages=messages, tools=tools)
    assert first.choices[0].finish_reason == "tool_calls"
    message = first.choices[0].message
    [call] = message.tool_calls or []
    args = call.function.parsed_arguments
    assert isinstance(args, GetWeather)
    result = get_weather(args.city, args.unit)
    messages += [message, {"role": "tool", "tool_call_id": call.id, "content": result}]
    final = oai.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
    assert final.choices[0].finish_reason == "stop"
    assert result in (final.choices[0].message.content or "")


def test_chat_tool_call_streamed_through_the_sdk_stream_helper(oai):
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages = [{"role": "user", "content": QUESTION}]
    with oai.chat.completions.stream(model="gpt-4o", messages=messages, tools=tools) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    assert kinds.count("tool_calls.function.arguments.done") == 1
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert final.choices[0].finish_reason == "tool_calls"


# ---------------------------------------------------------------- Responses API


def test_responses_parse_gets_a_parsed_pydantic_object(oai):
    resp = oai.responses.parse(model="gpt-4o", input="Forecast for Paris", text_format=Forecast)
    assert isinstance(resp.output_parsed, Forecast)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_tool_loop(oai, stream):
    tools: list[Any] = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": openai.pydantic_function_tool(GetWeather)["function"]["parameters"],
            "strict": True,
        }
    ]
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    if stream:
        with oai.responses.stream(model="gpt-4o", input=items, tools=tools) as events:
            kinds = [e.type for e in events]
            first = events.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
    else:
        first = oai.responses.create(model="gpt-4o", input=items, tools=tools)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    args = GetWeather.model_validate_json(call.arguments)
    result = get_weather(args.city, args.unit)
    items += [call, {"type": "function_call_output", "call_id": call.call_id, "output": result}]
    final = oai.responses.create(model="gpt-4o", input=items, tools=tools)
    assert result in final.output_text and final.id != first.id


# ---------------------------------------------------------------- Messages API

CLAUDE_TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "input_schema": GetWeather.model_json_schema(),
    }
]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_use_loop(claude, stream):
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    ask = {"model": "claude-sonnet-4", "max_tokens": 256, "tools": CLAUDE_TOOLS}
    if stream:
        with claude.messages.stream(messages=messages, **ask) as events:
            kinds = [e.type for e in events]
            first = events.get_final_message()
        assert "input_json" in kinds  # the SDK's event for each input_json_delta
    else:
        first = claude.messages.create(messages=messages, **ask)
    assert first.stop_reason == "tool_use"
    [use] = first.content
    assert use.type == "tool_use" and use.name == "get_weather"
    args = GetWeather.model_validate(use.input)
    result = get_weather(args.city, args.unit)
    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}],
        },
    ]
    final = claude.messages.create(messages=messages, **ask)
    assert final.stop_reason == "end_turn"
    assert final.content[0].type == "text" and result in final.content[0].text


def test_messages_parse_gets_a_parsed_pydantic_object(claude):
    msg = claude.messages.parse(
        model="claude-sonnet-4",
        max_tokens=1024,
        messages=[{"role": "user", "content": "Forecast for Paris"}],
        output_format=Forecast,
    )
    assert isinstance(msg.parsed_output, Forecast)
    assert json.loads(msg.content[0].text)["days"] == msg.parsed_output.days
