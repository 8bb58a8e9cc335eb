"""OpenAI's Responses API (``POST /v1/responses``).

Its stream is named events (``event: response.output_text.delta`` …), each with its name again in
the JSON ``type`` and a running ``sequence_number``; there is no ``data: [DONE]``. A stream is
complete with its terminal event: ``response.completed``, ``response.incomplete`` or
``response.failed`` (docs/spec.md §8). Usage is in the terminal event's ``response.usage``
(``input_tokens`` / ``output_tokens``), or in a JSON answer's ``usage``.

``gen_ai.operation.name`` is ``chat``: the GenAI semantic conventions have no operation of their
own for the Responses API (their OpenAI page tells the two chat APIs apart with
``openai.api.type = responses | chat_completions``, not with the operation name).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.config import RouteConfig
from gateway.context import Answer
from gateway.errors import InvalidRequest, UpstreamStreamError
from gateway.protocols.base import Api, carries_cache_control, detail, event_type, window_items

#: the events a complete stream ends with
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_TERMINAL_BYTES = tuple(b"event: " + t.encode() for t in TERMINAL)
#: input items that speak for the instructions: kept by history_window
_PINNED_ROLES = frozenset({"system", "developer"})


class Responses(Api):
    operation = "chat"
    cacheable = False  # docs/spec.md §5: not cached (x-gateway-cache: BYPASS)
    max_tokens_fields = ("max_output_tokens",)
    #: a response lives on the backend that made it (docs/spec.md §22)
    stateful = True
    end_marker = "a response.completed, response.incomplete or response.failed event"

    # ------------------------------------------------------------ requests

    def validate(self, payload: dict[str, Any]) -> None:
        super().validate(payload)
        value = payload.get("input")
        # optional: previous_response_id, conversation or a stored prompt can carry the input
        if value is not None and (not isinstance(value, str | list) or value == []):
            raise InvalidRequest(
                "'input' must be a string or a non-empty array of input items",
                code="invalid_input",
            )
        if isinstance(value, list):
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise InvalidRequest(f"'input[{i}]' must be an object", code="invalid_input")
        limit = payload.get("max_output_tokens")
        if limit is not None and (type(limit) is not int or limit < 1):
            raise InvalidRequest(
                "'max_output_tokens' must be an integer of at least 1", code="invalid_value"
            )
        for key, kind, what in (
            ("instructions", str, "a string"),
            ("tools", list, "an array"),
            ("metadata", dict, "an object"),
            ("previous_response_id", str, "a string"),
        ):
            v = payload.get(key)
            if v is not None and not isinstance(v, kind):
                raise InvalidRequest(f"'{key}' must be {what}", code="invalid_type")

    def apply_policies(
        self, payload: dict[str, Any], cfg: RouteConfig, tokens_field: str | None = None
    ) -> dict[str, Any]:
        notes = super().apply_policies(payload, cfg, tokens_field)
        items = payload.get("input")
        if (
            cfg.history_window is not None
            and isinstance(items, list)
            and not carries_cache_control(payload, "input", "tools")
        ):
            kept = window_items(items, cfg.history_window, _pinned, _opens)
            if kept is not None:
                payload["input"] = kept
                notes["policy.history_window"] = f"{len(items)}->{len(kept)}"
        return notes

    # ------------------------------------------------------------ answers

    def note_answer(self, answer: Answer, obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        kind = obj.get("type")
        if obj.get("object") == "response":  # a JSON answer: the Response object itself
            _note_response(answer, obj)
            if answer.captured is not None:
                answer.captured.extend(_output_texts(obj))
            return False
        if not isinstance(kind, str):
            return False
        if kind.endswith(".delta"):  # output text, refusal, tool arguments, reasoning …
            delta = obj.get("delta")
            captured = answer.captured
            if captured is not None and kind == "response.output_text.delta" and delta:
                captured.append(str(delta))
            return bool(delta)
        response = obj.get("response")
        if isinstance(response, dict) and kind.startswith("response."):
            _note_response(answer, response)  # created / in_progress / the terminal event
        return False

    # ------------------------------------------------------------ streams (docs/spec.md §8)

    def is_end(self, raw: bytes, data: bytes | None, obj: Any) -> bool:
        if isinstance(obj, dict):
            return obj.get("type") in TERMINAL
        return raw.startswith(_TERMINAL_BYTES) and event_type(raw, obj) in TERMINAL

    def error_event(self, cut: UpstreamStreamError, last: Any = None) -> bytes:
        """An ``error`` event: the fields of the Responses API's own (``ResponseErrorEvent``),
        with the next ``sequence_number``, plus an ``error`` object — what makes the openai SDK
        raise ``openai.APIError`` (its stream raises on any event whose data has ``error``)."""
        sequence = last.get("sequence_number") if isinstance(last, dict) else None
        error = {"type": cut.code, "code": cut.code, "message": cut.message, "param": None}
        payload = {
            "type": "error",
            "sequence_number": sequence + 1 if type(sequence) is int else 0,
            "code": cut.code,
            "message": cut.message,
            "param": None,
            "error": error,
        }
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


def conversation_id(payload: dict[str, Any]) -> str | None:
    """The conversation a Responses call belongs to (``gen_ai.conversation.id``): its
    ``conversation``, an id or an object with one (None: it names none)."""
    value = payload.get("conversation")
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) and 0 < len(value) <= 256 else None


def _note_response(answer: Answer, response: dict[str, Any]) -> None:
    """id, model, usage and how it ended, from a Response object (JSON or in an event)."""
    if answer.response_id is None and isinstance(response.get("id"), str):
        answer.response_id = response["id"]
    if answer.response_model is None and isinstance(response.get("model"), str):
        answer.response_model = response["model"]
    usage = response.get("usage")
    if isinstance(usage, dict):  # docs/spec.md §20: cached input and reasoning in *_details
        answer.usage(usage.get("input_tokens"), usage.get("output_tokens"))
        answer.tokens.parts(
            detail(usage, "input_tokens_details", "cached_tokens"),
            None,
            detail(usage, "output_tokens_details", "reasoning_tokens"),
        )
    status = response.get("status")
    if status in ("completed", "incomplete", "failed", "cancelled"):
        reason = status
        details = response.get("incomplete_details")
        if isinstance(details, dict) and isinstance(details.get("reason"), str):
            reason = details["reason"]  # max_output_tokens, content_filter
        answer.finish_reasons = [reason]


def _output_texts(response: dict[str, Any]) -> list[str]:
    texts: list[str] = []
    output = response.get("output")
    for item in output if isinstance(output, list) else ():
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "output_text":
                text = part.get("text")
                if isinstance(text, str) and text:
                    texts.append(text)
    return texts


def _pinned(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") in _PINNED_ROLES


def _opens(item: Any) -> bool:
    """Whether the window may start here: not at a tool's output (function_call_output,
    computer_call_output, …) whose call would be cut off."""
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    return not (isinstance(kind, str) and kind.endswith("_output"))
