"""Anthropic's Messages API (``POST /v1/messages``), for applications using the Anthropic SDK.

Its stream is named events: ``message_start`` (id, model, input usage), ``content_block_start``,
``content_block_delta`` …, ``content_block_stop``, ``message_delta`` (stop reason, output usage),
``message_stop``; ``ping`` may come at any time. A stream is complete with ``message_stop``
(docs/spec.md §8); a cut one ends with Anthropic's own ``event: error``, which the anthropic SDK
raises.

Tokens follow the GenAI semantic conventions' Anthropic page: ``gen_ai.usage.input_tokens`` is
``input_tokens + cache_read_input_tokens + cache_creation_input_tokens`` (Anthropic reports the
cached parts apart), ``gen_ai.usage.output_tokens`` the last ``output_tokens`` reported.
``gen_ai.operation.name`` is ``chat`` (the conventions' value for Anthropic inference).

``POST /v1/messages/count_tokens`` (:class:`CountTokens`) takes a Messages body and answers
``{"input_tokens": N}``: Claude Code asks it when to compact its context (docs/spec.md §22). It
is routed like messages but is no inference: its own ``gen_ai.operation.name``
(``count_tokens``), never cached, and its count is not usage (no tokens are debited or counted).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.config import RouteConfig
from gateway.context import Answer
from gateway.errors import InvalidRequest, UpstreamStreamError
from gateway.protocols.base import (
    Api,
    carries_cache_control,
    event_type,
    validate_messages,
    window_items,
)

_END = b"event: message_stop"
_INT_FIELDS = ("top_k",)


class Messages(Api):
    operation = "chat"
    cacheable = False  # docs/spec.md §5: not cached (x-gateway-cache: BYPASS)
    max_tokens_fields = ("max_tokens",)
    end_marker = "event: message_stop"

    # ------------------------------------------------------------ requests

    def validate(self, payload: dict[str, Any]) -> None:
        super().validate(payload)
        validate_messages(payload, content_required=True)
        system = payload.get("system")
        if system is not None and not isinstance(system, str | list):
            raise InvalidRequest("'system' must be a string or an array", code="invalid_type")
        for key in _INT_FIELDS:
            v = payload.get(key)
            if v is not None and type(v) is not int:
                raise InvalidRequest(f"'{key}' must be an integer", code="invalid_type")
        stop = payload.get("stop_sequences")
        if stop is not None and not isinstance(stop, list):
            raise InvalidRequest("'stop_sequences' must be an array", code="invalid_type")

    def apply_policies(
        self, payload: dict[str, Any], cfg: RouteConfig, tokens_field: str | None = None
    ) -> dict[str, Any]:
        notes = super().apply_policies(payload, cfg, tokens_field)
        if cfg.history_window is not None:
            _window_messages(payload, cfg.history_window, notes)
        return notes

    # ------------------------------------------------------------ answers

    def note_answer(self, answer: Answer, obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        kind = obj.get("type")
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return False
            if answer.captured is not None and isinstance(delta.get("text"), str):
                answer.captured.append(delta["text"])
            # text_delta, input_json_delta, thinking_delta, citations_delta …
            return any(delta.get(k) for k in ("text", "partial_json", "thinking", "citation"))
        if kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                _note_message(answer, message)
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                _note_stop(answer, delta.get("stop_reason"))
            _note_usage(answer, obj.get("usage"))
        elif kind == "message":  # a JSON answer
            _note_message(answer, obj)
            if answer.captured is not None:
                answer.captured.extend(_texts(obj))
        return False

    # ------------------------------------------------------------ streams (docs/spec.md §8)

    def is_end(self, raw: bytes, data: bytes | None, obj: Any) -> bool:
        if isinstance(obj, dict):
            return obj.get("type") == "message_stop"
        return raw.startswith(_END) and event_type(raw, obj) == "message_stop"

    def error_event(self, cut: UpstreamStreamError, last: Any = None) -> bytes:
        """Anthropic's stream error (``overloaded_error`` mid-stream looks alike): the anthropic
        SDK raises ``anthropic.APIStatusError`` on any ``event: error``."""
        payload = {
            "type": "error",
            "error": {"type": "api_error", "message": f"{cut.message} ({cut.code})"},
        }
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


class CountTokens(Messages):
    """``POST /v1/messages/count_tokens``: a Messages body, answered ``{"input_tokens": N}``."""

    operation = "count_tokens"

    def apply_policies(
        self, payload: dict[str, Any], cfg: RouteConfig, tokens_field: str | None = None
    ) -> dict[str, Any]:
        # no max_tokens cap (the endpoint refuses the field); the window messages would get,
        # so the count is of what a messages call with this body would send
        notes: dict[str, Any] = {}
        if cfg.history_window is not None:
            _window_messages(payload, cfg.history_window, notes)
        return notes

    def note_answer(self, answer: Answer, obj: Any) -> bool:
        return False  # a count is not usage: nothing is debited or counted as tokens

    def note_json_body(self, answer: Answer, body: bytes) -> None:
        """Nothing to read (and no parse): see :meth:`note_answer`."""


def _window_messages(payload: dict[str, Any], window: int, notes: dict[str, Any]) -> None:
    """``history_window`` over ``messages`` (docs/spec.md §12), unless the request marks a
    prompt-cache breakpoint (docs/spec.md §22)."""
    if carries_cache_control(payload, "messages", "system", "tools"):
        return
    messages: list[Any] = payload["messages"]
    # the system prompt is a field of its own: every message is history
    kept = window_items(messages, window, _never, _opens)
    if kept is not None:
        payload["messages"] = kept
        notes["policy.history_window"] = f"{len(messages)}->{len(kept)}"


def _note_message(answer: Answer, message: dict[str, Any]) -> None:
    if answer.response_id is None and isinstance(message.get("id"), str):
        answer.response_id = message["id"]
    if answer.response_model is None and isinstance(message.get("model"), str):
        answer.response_model = message["model"]
    _note_usage(answer, message.get("usage"))
    _note_stop(answer, message.get("stop_reason"))


def _note_usage(answer: Answer, usage: Any) -> None:
    """Input = input + cache reads + cache writes (semconv, Anthropic); output as reported.
    The cache reads are the cached input, the cache writes its own kind (docs/spec.md §20)."""
    if not isinstance(usage, dict):
        return
    fresh = usage.get("input_tokens")
    if type(fresh) is int:
        read = usage.get("cache_read_input_tokens")
        written = usage.get("cache_creation_input_tokens")
        read = read if type(read) is int else 0
        written = written if type(written) is int else 0
        answer.usage(fresh + read + written, None)
        answer.tokens.parts(read, written, None)
    answer.usage(None, usage.get("output_tokens"))


def _note_stop(answer: Answer, reason: Any) -> None:
    if isinstance(reason, str):
        answer.finish_reasons = [reason]  # end_turn, max_tokens, stop_sequence, tool_use …


def _texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    return [
        block["text"]
        for block in (content if isinstance(content, list) else ())
        if isinstance(block, dict) and isinstance(block.get("text"), str) and block["text"]
    ]


def _never(message: Any) -> bool:
    return False


def _opens(message: Any) -> bool:
    """The window starts at a user turn that is not a tool result (its tool_use would be cut)."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return False
    content = message.get("content")
    if isinstance(content, list):
        return not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    return True
