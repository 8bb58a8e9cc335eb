"""What every model API shares (gateway/protocols/base.py): where a prompt-cache breakpoint
(``cache_control``) can sit in a request, so ``history_window`` leaves it alone (docs/spec.md
§22)."""

from __future__ import annotations

from gateway.protocols.base import carries_cache_control

MARK = {"cache_control": {"type": "ephemeral"}}


def test_a_breakpoint_anywhere_a_request_can_carry_one_is_found():
    text = {"type": "text", "text": "x"}
    plain = {"messages": [{"role": "user", "content": [text]}], "system": [text], "tools": []}
    assert not carries_cache_control(plain, "messages", "system", "tools")
    cases = [
        {"cache_control": {"type": "ephemeral"}},  # top level (automatic caching)
        {"messages": [{"role": "user", "content": "x", **MARK}]},  # on a message
        {"messages": [{"role": "user", "content": [text, {**text, **MARK}]}]},  # on a block
        {"system": [{**text, **MARK}]},  # on a system block
        {"tools": [{"name": "t", "input_schema": {}, **MARK}]},  # on a tool
    ]
    for case in cases:
        assert carries_cache_control(case, "messages", "system", "tools"), case


def test_only_the_named_fields_are_looked_at_and_odd_shapes_are_no_breakpoint():
    assert not carries_cache_control({"system": [MARK]}, "messages")
    odd = {"messages": ["x", 3, {"content": "cache_control"}, {"content": [None, "y"]}]}
    assert not carries_cache_control(odd, "messages")
    assert not carries_cache_control({"messages": {"cache_control": 1}}, "messages")
