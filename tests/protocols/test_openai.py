"""Chat completions (gateway/protocols/openai.py): the window skips a request with a
prompt-cache breakpoint (OpenAI-compatible servers in front of Anthropic models take them)."""

from __future__ import annotations

from typing import Any

from gateway.config import RouteConfig
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
