"""OpenAI's chat completions, completions and embeddings APIs."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.config import RouteConfig
from gateway.context import Answer
from gateway.errors import InvalidRequest
from gateway.protocols.base import Api, carries_cache_control, detail, validate_messages

#: JSON answers bigger than this are embeddings: only their trailing usage object is parsed
_SMALL_BODY = 64 * 1024


def note_choices(answer: Answer, obj: dict[str, Any]) -> bool:
    """id/model/usage/finish reasons of a chat or completion object or chunk; True on content."""
    if answer.response_id is None and isinstance(obj.get("id"), str):
        answer.response_id = obj["id"]
    if answer.response_model is None and isinstance(obj.get("model"), str):
        answer.response_model = obj["model"]
    usage = obj.get("usage")
    if isinstance(usage, dict):
        note_usage(answer, usage)
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return False
    content = False
    for choice in choices:
        if isinstance(choice, dict) and _note_choice(answer, choice):
            content = True
    return content


def note_usage(answer: Answer, usage: dict[str, Any]) -> None:
    """Chat / completions / embeddings usage (docs/spec.md §20): ``prompt_tokens`` (cached ones
    included), ``prompt_tokens_details.cached_tokens``, ``completion_tokens`` (reasoning
    included), ``completion_tokens_details.reasoning_tokens``."""
    answer.usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
    answer.tokens.parts(
        detail(usage, "prompt_tokens_details", "cached_tokens"),
        None,
        detail(usage, "completion_tokens_details", "reasoning_tokens"),
    )


def _note_choice(answer: Answer, choice: dict[str, Any]) -> bool:
    fr = choice.get("finish_reason")
    if isinstance(fr, str):
        if answer.finish_reasons is None:
            answer.finish_reasons = []
        answer.finish_reasons.append(fr)
    delta = choice.get("delta")
    if isinstance(delta, dict):
        text = delta.get("content")
        content = bool(
            text
            or delta.get("tool_calls")
            or delta.get("refusal")
            or delta.get("reasoning_content")
        )
    else:
        text = choice.get("text")
        content = bool(text)
        message = choice.get("message")
        if isinstance(message, dict):
            text = message.get("content")
    if answer.captured is not None and isinstance(text, str) and text:
        answer.captured.append(text)
    return content


#: spliced after a body's opening brace when it has no ``stream_options`` at all
_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'


def ask_usage(body: bytes, payload: dict[str, Any]) -> bytes | None:
    """``stream_options.include_usage = true`` in a chat or completions stream's body
    (docs/spec.md §20); None when the client asked for usage itself.

    A body without ``stream_options`` keeps its bytes, the option spliced in front of them
    (no second serialisation); one with other stream options is serialised again.

    >>> ask_usage(b'{"model":"m"}', {"model": "m"})
    b'{"stream_options":{"include_usage":true},"model":"m"}'
    >>> ask_usage(b"{}", {"stream_options": {"include_usage": True}}) is None
    True
    >>> ask_usage(b"{}", {"stream_options": {"include_obfuscation": False}})
    b'{"stream_options":{"include_obfuscation":false,"include_usage":true}}'
    """
    if "stream_options" not in payload:
        start = body.find(b"{") + 1
        return body[:start] + _INCLUDE_USAGE + body[start:]
    opts = payload["stream_options"]
    if isinstance(opts, dict) and opts.get("include_usage") is True:
        return None
    options = {**opts, "include_usage": True} if isinstance(opts, dict) else {"include_usage": True}
    return orjson.dumps({**payload, "stream_options": options})


class _OpenAIApi(Api):
    def note_answer(self, answer: Answer, obj: Any) -> bool:
        return note_choices(answer, obj) if isinstance(obj, dict) else False

    def note_json_body(self, answer: Answer, body: bytes) -> None:
        if len(body) <= _SMALL_BODY:
            super().note_json_body(answer, body)
            return
        # Large bodies are embeddings: parse only the usage object at the end, not 1536 floats.
        i = body.rfind(b'"usage"')
        j = body.find(b"{", i) if i >= 0 else -1
        k = body.find(b"}", j) if j >= 0 else -1
        if k > j >= 0:
            try:
                usage = orjson.loads(body[j : k + 1])
            except orjson.JSONDecodeError:
                return
            if isinstance(usage, dict):
                note_usage(answer, usage)


class ChatCompletions(_OpenAIApi):
    operation = "chat"
    cacheable = True

    def ask_usage(self, body: bytes, payload: dict[str, Any]) -> bytes | None:
        return ask_usage(body, payload)

    def validate(self, payload: dict[str, Any]) -> None:
        super().validate(payload)
        validate_messages(payload, content_required=False)

    def apply_policies(
        self, payload: dict[str, Any], cfg: RouteConfig, tokens_field: str | None = None
    ) -> dict[str, Any]:
        notes = super().apply_policies(payload, cfg, tokens_field)
        if cfg.history_window is not None:
            window_messages(payload, "messages", cfg.history_window, notes)
        return notes


def window_messages(
    payload: dict[str, Any], field: str, window: int, notes: dict[str, Any]
) -> None:
    """``history_window`` (docs/spec.md §12): system/developer messages plus the last
    ``window`` others; never for a request that marks a prompt-cache breakpoint (§22)."""
    if carries_cache_control(payload, field, "tools"):
        return
    messages: list[Any] = payload[field]
    system = [m for m in messages if m.get("role") in ("system", "developer")]
    rest = [m for m in messages if m.get("role") not in ("system", "developer")]
    if len(rest) <= window:
        return
    kept = rest[-window:]
    # a tool result cannot open the window: its assistant tool_calls turn was cut off
    while kept and kept[0].get("role") == "tool":
        kept.pop(0)
    keep_ids = {id(m) for m in system} | {id(m) for m in kept}
    payload[field] = [m for m in messages if id(m) in keep_ids]
    notes["policy.history_window"] = f"{len(messages)}->{len(payload[field])}"


class Completions(_OpenAIApi):
    operation = "text_completion"
    cacheable = True

    def ask_usage(self, body: bytes, payload: dict[str, Any]) -> bytes | None:
        return ask_usage(body, payload)

    def validate(self, payload: dict[str, Any]) -> None:
        super().validate(payload)
        if not isinstance(payload.get("prompt"), str | list):
            raise InvalidRequest("'prompt' must be a string or an array", code="invalid_prompt")


class Embeddings(_OpenAIApi):
    operation = "embeddings"
    cacheable = True

    def validate(self, payload: dict[str, Any]) -> None:
        super().validate(payload)
        value = payload.get("input")
        if not isinstance(value, str | list) or value in ("", []):
            raise InvalidRequest(
                "'input' must be a non-empty string or array", code="invalid_input"
            )

    def apply_policies(
        self, payload: dict[str, Any], cfg: RouteConfig, tokens_field: str | None = None
    ) -> dict[str, Any]:
        return {}  # no completion to cap, no history to window
