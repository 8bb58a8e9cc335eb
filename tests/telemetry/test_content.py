"""Captured content in each API's shape (docs/spec.md §7): the GenAI conventions' JSON for
Anthropic's ``system`` and tool blocks, the Responses API's instructions and items; redaction
before the cut; a bounded cost whatever the body holds."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from gateway.telemetry.content import ContentPolicy


def _ctx(payload: dict[str, Any], captured: list[str] | None = None) -> Any:
    answer = SimpleNamespace(captured=captured or [], finish_reasons=["end_turn"])
    return SimpleNamespace(call=SimpleNamespace(payload=payload), answer=answer)


def test_anthropic_system_tools_and_tool_blocks():
    payload = {
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "lookup", "description": "secret plans", "input_schema": {}}],
        "messages": [
            {"role": "user", "content": "find it"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"q": 1}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "tu_1", "content": "found"},
                    {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
                ],
            },
        ],
    }
    got, truncated = ContentPolicy("full").attributes(_ctx(payload, ["done"]))
    assert not truncated
    assert json.loads(got["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "be brief"}
    ]
    assert json.loads(got["gen_ai.tool.definitions"]) == [{"type": "function", "name": "lookup"}]
    messages = json.loads(got["gen_ai.input.messages"])
    assert messages[1]["parts"] == [
        {"type": "tool_call", "name": "lookup", "id": "tu_1", "arguments": '{"q":1}'}
    ]
    assert messages[2]["parts"] == [
        {"type": "tool_call_response", "id": "tu_1", "response": "found"},
        {"type": "image"},  # never the data
    ]
    assert json.loads(got["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "done"}],
            "finish_reason": "end_turn",
        }
    ]
    meta, _ = ContentPolicy("metadata").attributes(_ctx(payload, ["done"]))
    assert "AAAA" not in str(meta) and "find it" not in str(meta) and '"q"' not in str(meta)
    assert json.loads(meta["gen_ai.input.messages"])[2]["parts"][0] == {
        "type": "tool_call_response",
        "id": "tu_1",
        "size": 5,
    }


def test_responses_instructions_and_items():
    payload = {
        "instructions": "you are terse",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ],
        "tools": [{"type": "function", "name": "weather"}, {"type": "web_search"}],
    }
    got, _ = ContentPolicy("full").attributes(_ctx(payload))
    assert json.loads(got["gen_ai.system_instructions"])[0]["content"] == "you are terse"
    roles = [(m["role"], m["parts"][0]["type"]) for m in json.loads(got["gen_ai.input.messages"])]
    assert roles == [("user", "text"), ("assistant", "tool_call"), ("tool", "tool_call_response")]
    tools = json.loads(got["gen_ai.tool.definitions"])
    assert tools == [{"type": "function", "name": "weather"}, {"type": "web_search"}]


def test_redaction_runs_before_the_cut():
    # 72 bytes: 16 for the message, 16 for its part, 40 of text
    policy = ContentPolicy("full", max_bytes=72, redact=["TOKEN-[0-9]{6}"])
    text = "x" * 34 + "TOKEN-123456 and more"  # the secret straddles the cut
    got, truncated = policy.attributes(_ctx({"messages": [{"role": "user", "content": text}]}))
    content = json.loads(got["gen_ai.input.messages"])[0]["parts"][0]["content"]
    assert truncated and content == "x" * 34 + "[REDAC"  # never "TOKEN-": a match cut in half


class _Counting:
    """A pattern that counts the characters it is run over."""

    def __init__(self, pattern: Any) -> None:
        self.pattern = pattern
        self.seen = 0

    def sub(self, repl: str, text: str) -> str:
        self.seen += len(text)
        return str(self.pattern.sub(repl, text))


def test_a_huge_body_costs_what_the_cap_allows():
    policy = ContentPolicy("full", max_bytes=1024, redact=["a+b"])
    counting = policy._pattern = _Counting(policy._pattern)
    huge = {"messages": [{"role": "user", "content": "a" * 5_000_000}] * 200}
    got, truncated = policy.attributes(_ctx(huge))
    assert truncated and len(json.loads(got["gen_ai.input.messages"])) < 70
    # the patterns saw the budget plus a margin, never the 1 GB of text
    assert 0 < counting.seen <= 1024 + 256
