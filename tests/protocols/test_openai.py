"""Chat completions (gateway/protocols/openai.py): the window skips a request with a
prompt-cache breakpoint (OpenAI-compatible servers in front of Anthropic models take them)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import RouteConfig
from gateway.errors import InvalidRequest
from gateway.protocols.openai import ChatCompletions

WINDOW = RouteConfig(models=("*",), backends=("b",), history_window=1)


def chat(mark: bool) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "text", "text": "now?"}
    if mark:
        part["cache_control"] = {"type": "ephemeral"}
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": [part]},
    ]
    return {"model": "m", "messages": messages}


def test_the_window_skips_a_request_with_a_breakpoint():
    marked = chat(mark=True)
    assert ChatCompletions().apply_policies(marked, WINDOW) == {}
    assert len(marked["messages"]) == 4
    plain = chat(mark=False)
    assert ChatCompletions().apply_policies(plain, WINDOW) == {"policy.history_window": "4->2"}


_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_tokens", "10", "'max_tokens' must be an integer"),
        ("max_tokens", 1.5, "'max_tokens' must be an integer"),
        ("n", True, "'n' must be an integer"),
        ("seed", "x", "'seed' must be an integer"),
        ("max_completion_tokens", 0, "'max_completion_tokens' must be at least 1"),
        ("n", -2, "'n' must be at least 1"),
        ("temperature", "hot", "'temperature' must be a number"),
        ("top_p", False, "'top_p' must be a number"),
        ("frequency_penalty", [1], "'frequency_penalty' must be a number"),
    ],
)
def test_typed_fields_are_refused_with_the_field_named(field: str, value: Any, message: str):
    with pytest.raises(InvalidRequest) as err:
        ChatCompletions().validate({**_CHAT, field: value})
    assert err.value.message == message


def test_typed_fields_in_range_and_nulls_pass():
    ok = {
        "max_tokens": 1,
        "n": 2,
        "seed": 0,
        "temperature": 0,
        "top_p": 0.5,
        "presence_penalty": -1,
    }
    ChatCompletions().validate({**_CHAT, **ok, "frequency_penalty": None, "unknown": "x"})
