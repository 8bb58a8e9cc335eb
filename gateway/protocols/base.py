"""What the gateway needs to know about one model API (docs/spec.md §5, §8).

Each routed endpoint (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/responses``, ``/v1/messages``) has one :class:`Api`: how its body is validated, how the
route's policies apply, how usage and ids are read from its answers, and how its streams end and
are cut. The router, the relays and the cache ask it instead of knowing any API themselves.
One instance serves every request of its path: an Api keeps no per-request state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.config import RouteConfig
from gateway.context import Answer
from gateway.errors import InvalidRequest, UpstreamStreamError

_INT_FIELDS = ("max_tokens", "max_completion_tokens", "n", "seed")
_NUM_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_INT, _NUM = "integer", "number"
#: the typed fields :meth:`Api.validate` checks, by name
_FIELD_KINDS = dict.fromkeys(_INT_FIELDS, _INT) | dict.fromkeys(_NUM_FIELDS, _NUM)


class Api:
    #: gen_ai.operation.name
    operation = ""
    #: answers may be cached (docs/spec.md §10)
    cacheable = False
    #: fields that cap the completion length (the first one is set when none is present)
    max_tokens_fields: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
    #: answers live on the backend that made them and later requests name them by id
    #: (the Responses API's ``previous_response_id``, docs/spec.md §22)
    stateful = False

    # ------------------------------------------------------------ requests

    def validate(self, payload: dict[str, Any]) -> None:
        """Raise :class:`InvalidRequest` for a body the upstream would refuse anyway (docs/spec.md
        §5)."""
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest(
                "'model' is required and must be a non-empty string", code="invalid_model"
            )
        stream = payload.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise InvalidRequest("'stream' must be a boolean", code="invalid_type")
        opts = payload.get("stream_options")
        if opts is not None and not isinstance(opts, dict):
            raise InvalidRequest("'stream_options' must be an object", code="invalid_type")
        # only the fields the client sent: one lookup per field present, not per field known
        for key, v in payload.items():
            kind = _FIELD_KINDS.get(key)
            if kind is None or v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int if kind is _INT else int | float):
                what = "an integer" if kind is _INT else "a number"
                raise InvalidRequest(f"'{key}' must be {what}", code="invalid_type")
            if kind is _INT and v < 1 and key != "seed":
                raise InvalidRequest(f"'{key}' must be at least 1", code="invalid_value")

    def apply_policies(
        self, payload: dict[str, Any], cfg: RouteConfig, tokens_field: str | None = None
    ) -> dict[str, Any]:
        """Apply ``max_tokens_cap`` and ``history_window`` in place; return what changed.

        ``tokens_field``: the field the backend takes when the client named no limit (one of
        :attr:`max_tokens_fields`; else the first of them)."""
        notes: dict[str, Any] = {}
        if cfg.max_tokens_cap is not None:
            fields = self.max_tokens_fields
            if tokens_field in fields and tokens_field != fields[0]:
                fields = (tokens_field, *(f for f in fields if f != tokens_field))
            cap_tokens(payload, cfg.max_tokens_cap, fields, notes)
        return notes

    def ask_usage(self, body: bytes, payload: dict[str, Any]) -> bytes | None:
        """The body that asks a stream for its usage, when the API only reports it on request
        and the client did not ask (docs/spec.md §20, "nothing unbilled"); None: send ``body``
        as it is. Responses and Messages streams report usage in their final events anyway."""
        return None

    # ------------------------------------------------------------ answers

    def note_answer(self, answer: Answer, obj: Any) -> bool:
        """Record id/model/usage/finish reasons from an answer or a stream event's JSON.

        Returns True when the object carries content (time to first token counts from it).
        """
        return False

    def note_json_body(self, answer: Answer, body: bytes) -> None:
        """Read usage (and ids) from a complete JSON answer."""
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        self.note_answer(answer, obj)

    # ------------------------------------------------------------ streams (docs/spec.md §8)

    def is_end(self, raw: bytes, data: bytes | None, obj: Any) -> bool:
        """Whether this event is the stream's end marker (nothing after it is relayed)."""
        return data == b"[DONE]"

    def error_event(self, cut: UpstreamStreamError, last: Any = None) -> bytes:
        """The event a cut stream ends with, so this API's SDK raises.

        ``last`` is the parsed JSON of the last event relayed before the cut (None if none).
        """
        return cut.sse_event()

    #: what a complete stream ends with, for error messages
    end_marker = "data: [DONE]"


def validate_messages(payload: dict[str, Any], *, content_required: bool) -> None:
    """``messages`` (docs/spec.md §5), for chat completions and Anthropic's Messages alike: a
    non-empty array of objects, each with a string ``role``; with ``content_required``, each
    ``content`` a string or an array of content blocks (Anthropic requires it; an OpenAI
    assistant turn that calls tools may have none).

    >>> validate_messages({"messages": [{"role": "user"}]}, content_required=False)
    >>> validate_messages({"messages": [{"role": "user"}]}, content_required=True)
    Traceback (most recent call last):
    ...
    gateway.errors.InvalidRequest: 'messages[0].content' must be a string or an array of ...
    """
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", code="invalid_messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidRequest(
                f"'messages[{i}]' must be an object with a string 'role'",
                code="invalid_messages",
            )
        if content_required and not isinstance(m.get("content"), str | list):
            raise InvalidRequest(
                f"'messages[{i}].content' must be a string or an array of content blocks",
                code="invalid_messages",
            )


def cap_tokens(
    payload: dict[str, Any], cap: int, fields: tuple[str, ...], notes: dict[str, Any]
) -> None:
    """``max_tokens_cap`` (docs/spec.md §12): clamp the fields present, or set the first when none
    is."""
    present = [k for k in fields if payload.get(k) is not None]
    for key in present:
        if payload[key] > cap:
            notes[f"policy.{key}"] = f"{payload[key]}->{cap}"
            payload[key] = cap
    if not present:
        payload[fields[0]] = cap
        notes[f"policy.{fields[0]}"] = f"unset->{cap}"


def detail(usage: dict[str, Any], field: str, key: str) -> Any:
    """``usage[field][key]`` when both are there (a usage object's ``*_details``), else None.

    >>> detail({"x_details": {"cached_tokens": 8}}, "x_details", "cached_tokens")
    8
    >>> detail({"x_details": None}, "x_details", "cached_tokens") is None
    True
    """
    details = usage.get(field)
    return details.get(key) if isinstance(details, dict) else None


def event_type(raw: bytes, obj: Any) -> str | None:
    """The type of a named SSE event: its JSON ``type`` (Responses and Messages events carry
    their name there), else its ``event:`` line.

    >>> event_type(b"event: ping\\ndata: {}\\n\\n", {})
    'ping'
    >>> event_type(b"data: {}", {"type": "message_stop"})
    'message_stop'
    """
    if isinstance(obj, dict):
        kind = obj.get("type")
        if isinstance(kind, str):
            return kind
    if raw.startswith(b"event:"):
        line = raw.split(b"\n", 1)[0]
        return line[6:].strip().decode("latin-1") or None
    return None


def carries_cache_control(payload: dict[str, Any], *fields: str) -> bool:
    """Whether a request marks a prompt-cache breakpoint (``cache_control``) anywhere it can:
    at its top level, or on an item of ``fields`` (messages, system blocks, tools) or on a
    content block of such an item. ``history_window`` leaves such a request alone
    (docs/spec.md §22): dropping messages would change the prefix the breakpoint caches.

    >>> carries_cache_control({"messages": [{"role": "user", "content": "hi"}]}, "messages")
    False
    >>> block = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    >>> carries_cache_control({"messages": [{"role": "user", "content": [block]}]}, "messages")
    True
    >>> carries_cache_control({"system": [block], "messages": []}, "messages", "system")
    True
    """
    if "cache_control" in payload:
        return True
    for field in fields:
        items = payload.get(field)
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, dict):
                continue
            if "cache_control" in item:
                return True
            content = item.get("content")
            if isinstance(content, list):
                for block in content:
                    if isinstance(block, dict) and "cache_control" in block:
                        return True
    return False


def window_items(
    items: list[Any],
    window: int,
    pinned: Callable[[Any], bool],
    opens: Callable[[Any], bool],
) -> list[Any] | None:
    """``history_window`` (docs/spec.md §12) over a list of conversation items: the ``pinned`` items
    (system instructions) plus the last ``window`` others, in their original order.

    The window starts at an item that ``opens`` a turn: a tool result cut off from the call that
    asked for it is an error upstream, so the window is moved later to the next opening item, or
    (when none follows) earlier to the last one. Returns None when nothing is dropped (or no item
    could open the window).

    With ``s`` a system message, ``u`` a user turn, ``a`` an answer and ``t`` a tool result:

    >>> system, user = (lambda m: m == "s"), (lambda m: m == "u")
    >>> "".join(window_items(list("suauatu"), 4, system, user) or [])
    'suatu'
    >>> "".join(window_items(list("suauat"), 2, system, user) or [])  # 'at' cannot open
    'suat'
    >>> window_items(list("sua"), 2, system, user) is None
    True
    """
    rest = [i for i, item in enumerate(items) if not pinned(item)]
    if len(rest) <= window:
        return None
    start = len(rest) - window
    first = next((k for k in range(start, len(rest)) if opens(items[rest[k]])), None)
    if first is None:
        first = next((k for k in range(start - 1, -1, -1) if opens(items[rest[k]])), None)
    if first is None or first == 0:
        return None
    dropped = {rest[k] for k in range(first)}
    return [item for i, item in enumerate(items) if i not in dropped]
