"""The Responses API (gateway/protocols/responses.py): stateful (docs/spec.md §22), its window
skipping a request with a prompt-cache breakpoint."""

from __future__ import annotations

from typing import Any

from gateway.config import RouteConfig
from gateway.protocols import BY_PATH
from gateway.protocols.responses import Responses

WINDOW = RouteConfig(models=("*",), backends=("b",), history_window=1)


def items(mark: bool) -> list[Any]:
    part: dict[str, Any] = {"type": "input_text", "text": "now?"}
    if mark:
        part["cache_control"] = {"type": "ephemeral"}
    return [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": [part]},
    ]


def test_only_the_responses_api_is_stateful():
    assert [p for p, api in BY_PATH.items() if api.stateful] == ["/v1/responses"]


def test_the_window_skips_a_request_with_a_breakpoint():
    marked = {"model": "m", "input": items(mark=True)}
    assert Responses().apply_policies(marked, WINDOW) == {}
    assert len(marked["input"]) == 3
    plain = {"model": "m", "input": items(mark=False)}
    assert Responses().apply_policies(plain, WINDOW) == {"policy.history_window": "3->1"}
