"""What the relay notices in the events it passes on (docs/spec.md §19): model responses.

The relay never changes a message; it reads the ``type`` of text messages cheaply, as the
UTF-8 bytes it relays (:func:`event_type`: a prefix check for the ``{"type":"…"`` every OpenAI
event starts with; a message that puts it elsewhere is parsed only when it names an event the
telemetry follows at all), and parses only the few events a response's telemetry needs:
``response.created`` (its id), the first ``response.*.delta`` of a response when several are
open (which one it belongs to), ``response.done`` (status and usage).

TTFT of a response = its first delta written to the client minus what started it: the client's
``response.create`` as the gateway read it, or with server VAD the upstream's
``input_audio_buffer.committed`` (docs/spec.md §19). Usage is the Realtime API's
(``input_tokens``, ``input_token_details.cached_tokens``, ``output_tokens``; the Responses
API's ``input_tokens_details`` is read too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

#: messages up to this size whose type is not at their start are parsed to find it
PARSE_LIMIT = 64 * 1024
_PREFIXES = (b'{"type":"', b'{"type": "')
#: in a client message: the only event whose type the telemetry needs
_CREATE = b'"response.create"'
#: in an upstream message: the events the telemetry follows (a message without either is
#: never parsed)
_RESPONSE, _COMMITTED = b'"response.', b'"input_audio_buffer.committed"'

#: the deltas a response's first content is (GA names, and the beta's)
DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.function_call_arguments.delta",
        "response.text.delta",
        "response.audio.delta",
        "response.audio_transcript.delta",
    }
)


def leading_type(message: bytes) -> str | None:
    """The ``type`` of an event that starts with it (None: it does not).

    >>> leading_type(b'{"type":"response.done","response":{}}')
    'response.done'
    >>> leading_type(b'{"event_id": "e1", "type": "response.create"}') is None
    True
    """
    for prefix in _PREFIXES:
        if message.startswith(prefix):
            start = len(prefix)
            end = message.find(b'"', start)
            return message[start:end].decode("utf-8", "replace") if end > 0 else None
    return None


def event_type(message: bytes) -> str | None:
    """The ``type`` of an event (None: not an event the relay can read cheaply).

    >>> event_type(b'{"type":"response.done","response":{}}')
    'response.done'
    >>> event_type(b'{"event_id": "e1", "type": "response.create"}')
    'response.create'
    """
    kind = leading_type(message)
    if kind is not None or len(message) > PARSE_LIMIT:
        return kind
    try:
        event = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    kind = event.get("type") if isinstance(event, dict) else None
    return kind if isinstance(kind, str) else None


def _object(message: bytes) -> dict[str, Any]:
    try:
        event = orjson.loads(message)
    except orjson.JSONDecodeError:
        return {}
    return event if isinstance(event, dict) else {}


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


class ModelResponse:
    """One model response in a session: its span, TTFT and usage."""

    __slots__ = (
        "cached_tokens",
        "cost_usd",
        "created",
        "done",
        "first_delta",
        "id",
        "input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "span_id",
        "status",
        "trigger",
    )

    def __init__(self, response_id: str, created: float, trigger: float | None) -> None:
        self.id = response_id
        self.created = created
        self.trigger = trigger
        self.first_delta: float | None = None
        self.done: float | None = None
        self.status = "in_progress"
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.reasoning_tokens: int | None = None
        #: USD for this response's usage (docs/spec.md §20; None: no price, or no usage)
        self.cost_usd: float | None = None
        self.span_id = 0

    def ttft(self) -> float | None:
        if self.first_delta is None or self.trigger is None:
            return None
        return max(0.0, self.first_delta - self.trigger)

    def reported(self) -> bool:
        """Whether ``response.done`` told usage."""
        return self.input_tokens is not None or self.output_tokens is not None

    def view(self) -> dict[str, Any]:
        """What the live view shows of it (docs/spec.md §19: responses with TTFT)."""
        ttft = self.ttft()
        done = self.done
        return {
            "id": self.id,
            "status": self.status,
            "ttft_ms": None if ttft is None else round(ttft * 1000, 3),
            "duration_ms": None if done is None else round((done - self.created) * 1000, 3),
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
        }

    def usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.input_tokens = _int(usage.get("input_tokens"))
        self.output_tokens = _int(usage.get("output_tokens"))
        details = usage.get("input_token_details", usage.get("input_tokens_details"))
        if isinstance(details, dict):
            self.cached_tokens = _int(details.get("cached_tokens"))
        out = usage.get("output_token_details", usage.get("output_tokens_details"))
        if isinstance(out, dict):
            self.reasoning_tokens = _int(out.get("reasoning_tokens"))


#: told about each response when it is done
OnDone = Callable[[ModelResponse], None]


class SessionResponses:
    """The responses of one session, followed from the events both ways."""

    __slots__ = ("_awaiting_delta", "_on_done", "_open", "_trigger", "count", "session_id")

    def __init__(self, on_done: OnDone) -> None:
        self._on_done = on_done
        #: response id -> the response, from response.created to response.done
        self._open: dict[str, ModelResponse] = {}
        #: open responses without their first delta yet
        self._awaiting_delta = 0
        #: when the next response was asked for (response.create read, or a VAD commit)
        self._trigger: float | None = None
        self.count = 0
        #: the upstream's id of the session (its ``session.created``): the conversation's
        self.session_id: str | None = None

    def client_message(self, message: bytes, read_at: float) -> None:
        """A client text message (UTF-8), once written upstream: a ``response.create`` starts
        the next response's TTFT (only the first one before that response is created)."""
        if self._trigger is not None or _CREATE not in message:
            return
        if event_type(message) == "response.create":
            self._trigger = read_at

    def upstream_message(self, message: bytes, written_at: float) -> None:
        """An upstream text message (UTF-8), once written to the client (its write time is the
        one TTFT counts)."""
        kind = leading_type(message)
        if kind is None:
            if _RESPONSE not in message and _COMMITTED not in message:
                return
            kind = event_type(message)
            if kind is None:
                return
        if kind in DELTAS:
            if self._awaiting_delta:
                self._first_delta(message, written_at)
        elif kind == "response.created":
            response = _object(message).get("response")
            rid = response.get("id") if isinstance(response, dict) else None
            self._open[rid if isinstance(rid, str) else f"#{self.count}"] = ModelResponse(
                rid if isinstance(rid, str) else "", written_at, self._trigger
            )
            self._awaiting_delta += 1
            self._trigger = None
            self.count += 1
        elif kind == "response.done":
            self._done(message, written_at)
        elif kind == "session.created" and self.session_id is None:
            session = _object(message).get("session")
            sid = session.get("id") if isinstance(session, dict) else None
            if isinstance(sid, str) and 0 < len(sid) <= 256:
                self.session_id = sid
        elif kind == "input_audio_buffer.committed" and self._trigger is None:
            self._trigger = written_at  # server VAD: the turn the next response answers
        elif kind == "error" and not self._open:
            self._trigger = None  # e.g. a response.create refused: no response will follow

    def _first_delta(self, message: bytes, at: float) -> None:
        waiting = [r for r in self._open.values() if r.first_delta is None]
        if not waiting:  # pragma: no cover - the count says there is one
            self._awaiting_delta = 0
            return
        if len(waiting) > 1:  # responses in parallel: the delta names its own
            rid = _object(message).get("response_id")
            waiting = [r for r in waiting if r.id == rid] or waiting[:1]
        waiting[0].first_delta = at
        self._awaiting_delta -= 1

    def _done(self, message: bytes, at: float) -> None:
        response = _object(message).get("response")
        if not isinstance(response, dict):
            return
        rid = response.get("id")
        found = self._open.pop(rid, None) if isinstance(rid, str) else None
        if found is None and self._open:  # no id, or one we did not see created
            found = self._open.pop(next(iter(self._open)))
        if found is None:
            return
        if found.first_delta is None:
            self._awaiting_delta -= 1
        found.done = at
        status = response.get("status")
        found.status = status if isinstance(status, str) else "completed"
        found.usage(response.get("usage"))
        self._on_done(found)

    def idle(self, now: float, stale_s: float) -> bool:
        """No response in progress, and none asked for in the last ``stale_s`` that has not
        started yet (an older ask, or a VAD commit that creates no response, is not waited
        for)."""
        trigger = self._trigger
        return not self._open and (trigger is None or now - trigger > stale_s)

    @property
    def in_progress(self) -> bool:
        """A response has started and is not done."""
        return bool(self._open)

    def unfinished(self) -> list[ModelResponse]:
        """Responses the session ended in the middle of."""
        out = list(self._open.values())
        self._open.clear()
        self._awaiting_delta = 0
        return out


__all__ = ["DELTAS", "ModelResponse", "SessionResponses", "event_type", "leading_type"]
