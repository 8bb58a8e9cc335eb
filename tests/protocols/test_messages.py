"""The Messages API and its token count (gateway/protocols/messages.py): policies, and a count
that is no usage (docs/spec.md §12, §22)."""

from __future__ import annotations

from typing import Any

from gateway.config import RouteConfig
from gateway.context import Answer
from gateway.protocols import BY_OPERATION, BY_PATH
from gateway.protocols.messages import CountTokens, Messages

POLICIES = RouteConfig(models=("*",), backends=("b",), max_tokens_cap=100, history_window=2)


def conversation(mark: bool) -> dict[str, Any]:
    last: dict[str, Any] = {"type": "text", "text": "now?"}
    if mark:
        last["cache_control"] = {"type": "ephemeral"}
    messages: list[Any] = []
    for i in range(3):
        messages += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
    messages.append({"role": "user", "content": [last]})
    return {"model": "claude-x", "max_tokens": 500, "messages": messages}


def test_the_window_skips_a_request_with_a_breakpoint_and_the_cap_still_applies():
    marked = conversation(mark=True)
    notes = Messages().apply_policies(marked, POLICIES)
    assert notes == {"policy.max_tokens": "500->100"}
    assert len(marked["messages"]) == 7
    plain = conversation(mark=False)
    notes = Messages().apply_policies(plain, POLICIES)
    assert notes["policy.history_window"] == "7->1"


def test_count_tokens_windows_like_messages_but_never_sets_max_tokens():
    api = BY_PATH["/v1/messages/count_tokens"]
    assert isinstance(api, CountTokens) and api.operation == "count_tokens"
    assert not api.cacheable and "count_tokens" not in BY_OPERATION
    plain = conversation(mark=False)
    del plain["max_tokens"]  # the endpoint refuses the field: the cap must not add it
    assert api.apply_policies(plain, POLICIES) == {"policy.history_window": "7->1"}
    assert "max_tokens" not in plain
    marked = conversation(mark=True)
    del marked["max_tokens"]
    assert api.apply_policies(marked, POLICIES) == {}


def test_a_count_is_not_usage():
    answer = Answer()
    CountTokens().note_json_body(answer, b'{"input_tokens": 123456}')
    assert answer.input_tokens is None and answer.output_tokens is None
