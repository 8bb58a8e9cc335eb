"""Cache entries: one entry serves both forms (docs/spec.md §10).

Whatever filled it — a JSON answer or a stream — an entry holds the complete JSON answer, and
when a stream filled it, the stream's own chunks too. A JSON request gets the JSON bytes as
stored (no re-serialisation on a hit); a streaming request gets the original chunks at their
original granularity, or chunks synthesised from the JSON, then the usage chunk when asked
for (``stream_options.include_usage``) and ``data: [DONE]``. No artificial delays.

Wire format (version 1)::

    b"GWC1" | u32 big-endian meta length | meta JSON | answer JSON
    meta = {"t": stored-at epoch s, "op": operation, "chunks": [chunk JSON text, ...] | null}
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.types import RawHeaders

MAGIC = b"GWC1"
_LEN = struct.Struct(">I")


@dataclass(slots=True)
class Entry:
    """One cached answer; treated as immutable once made (not frozen: a frozen dataclass's
    ``__init__`` costs a call per field, and every hit of a shared store builds one)."""

    stored_at: float
    operation: str
    body: bytes
    #: the data payloads of the original stream's chunks (usage-only chunk excluded), if any
    chunks: list[bytes] | None
    #: the answer's (input, output) token counts, so a hit needs no parse of the body
    tokens: tuple[int | None, int | None] = (None, None)
    #: the body in the Content-Encodings hits asked for, made on the first such hit (coding ->
    #: encoded body, its headers): an entry kept between hits is compressed once per coding
    encoded: dict[str, tuple[bytes, RawHeaders]] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )
    #: the SSE events synthesised from the JSON answer (no stream filled the entry), and its
    #: usage event (``b""``: none), made on the first streaming hit that needs them
    synthesised: tuple[bytes, ...] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )
    usage_sse: bytes | None = dataclasses.field(default=None, compare=False, repr=False)

    def encode(self) -> bytes:
        meta = orjson.dumps(
            {
                "t": self.stored_at,
                "op": self.operation,
                "chunks": [c.decode() for c in self.chunks] if self.chunks is not None else None,
                "u": self.tokens,
            }
        )
        return MAGIC + _LEN.pack(len(meta)) + meta + self.body

    @classmethod
    def decode(cls, raw: bytes) -> Entry | None:
        """None for anything that is not a v1 entry (a foreign or corrupt value is a miss)."""
        if raw[:4] != MAGIC or len(raw) < 8:
            return None
        (n,) = _LEN.unpack_from(raw, 4)
        try:
            meta = orjson.loads(raw[8 : 8 + n])
            chunks = meta["chunks"]
            tokens = meta.get("u") or (None, None)
            return cls(
                float(meta["t"]),
                str(meta["op"]),
                raw[8 + n :],
                [c.encode() for c in chunks] if chunks is not None else None,
                (tokens[0], tokens[1]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None


# ---------------------------------------------------------------- stream -> JSON


class StreamCollector:
    """Tees a relayed stream into an entry: the chunks, and the JSON answer they add up to.

    Bounded: past ``limit`` bytes it stops collecting and the answer is not stored.
    """

    __slots__ = ("_choices", "_chunks", "_meta", "_size", "limit", "operation", "overflow", "usage")

    def __init__(self, operation: str, limit: int) -> None:
        self.operation = operation
        self.limit = limit
        self.overflow = False
        self._size = 0
        self._chunks: list[bytes] = []
        self._choices: dict[int, dict[str, Any]] = {}
        self._meta: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None

    def add(self, data: bytes, obj: Any) -> None:
        """One SSE data payload (not ``[DONE]``) and its parsed JSON."""
        if self.overflow:
            return
        self._size += len(data)
        if self._size > self.limit:
            self.overflow = True
            self._chunks.clear()
            return
        if not isinstance(obj, dict):
            return
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if key in obj and key not in self._meta:
                self._meta[key] = obj[key]
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        if isinstance(choices, list) and not choices:
            return  # the usage-only chunk: replayed only when the new request asks for it
        self._chunks.append(data)
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict):
                self._merge(choice)

    def _merge(self, choice: dict[str, Any]) -> None:
        index = choice.get("index", 0)
        acc = self._choices.setdefault(index, {"index": index, "finish_reason": None})
        if choice.get("finish_reason") is not None:
            acc["finish_reason"] = choice["finish_reason"]
        if "logprobs" in choice and choice["logprobs"] is not None:
            acc["logprobs"] = choice["logprobs"]
        if self.operation == "text_completion":
            acc["text"] = acc.get("text", "") + (choice.get("text") or "")
            return
        delta = choice.get("delta") or {}
        msg = acc.setdefault("message", {"role": "assistant", "content": None})
        if delta.get("role"):
            msg["role"] = delta["role"]
        for field in ("content", "refusal", "reasoning_content"):
            piece = delta.get(field)
            if isinstance(piece, str):
                msg[field] = (msg.get(field) or "") + piece
        for call in delta.get("tool_calls") or ():
            _merge_tool_call(msg.setdefault("tool_calls", []), call)

    def entry(self, stored_at: float) -> Entry | None:
        if self.overflow or not self._chunks:
            return None
        obj: dict[str, Any] = {
            "id": self._meta.get("id"),
            "object": "chat.completion" if self.operation == "chat" else "text_completion",
            "created": self._meta.get("created"),
            "model": self._meta.get("model"),
            "choices": [self._choices[i] for i in sorted(self._choices)],
        }
        for key in ("system_fingerprint", "service_tier"):
            if key in self._meta:
                obj[key] = self._meta[key]
        if self.usage is not None:
            obj["usage"] = self.usage
        for choice in obj["choices"]:
            if self.operation == "chat":
                choice.setdefault("message", {"role": "assistant", "content": None})
                choice.setdefault("logprobs", None)
            else:
                choice.setdefault("text", "")
                choice.setdefault("logprobs", None)
        body = orjson.dumps(obj)
        if len(body) > self.limit:
            return None
        usage = self.usage or {}
        tokens = (usage.get("prompt_tokens"), usage.get("completion_tokens"))
        return Entry(stored_at, self.operation, body, list(self._chunks), tokens)


def _merge_tool_call(calls: list[dict[str, Any]], delta: Any) -> None:
    if not isinstance(delta, dict):
        return
    index = delta.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    fn = delta.get("function") or {}
    if fn.get("name"):
        call["function"]["name"] += fn["name"]
    if fn.get("arguments"):
        call["function"]["arguments"] += fn["arguments"]


# ---------------------------------------------------------------- entry -> stream


def sse(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


def replay_events(entry: Entry, include_usage: bool) -> Iterator[bytes]:
    """The SSE events of a cached answer, for a streaming request (each one event).

    What is synthesised from the JSON answer is made once per entry (kept on it), not per hit.
    """
    if entry.chunks is not None:
        for data in entry.chunks:
            yield sse(data)
    else:
        synthesised = entry.synthesised
        if synthesised is None:
            answer = orjson.loads(entry.body)
            synthesised = entry.synthesised = tuple(_synthesised_chunks(entry.operation, answer))
        yield from synthesised
    if include_usage:
        usage = usage_event(entry)
        if usage is not None:
            yield usage
    yield DONE_EVENT


def usage_event(entry: Entry) -> bytes | None:
    """The ``choices: []`` usage chunk of ``stream_options.include_usage``, when usage is known
    (made once per entry)."""
    usage = entry.usage_sse
    if usage is None:
        usage = entry.usage_sse = _usage_event(entry.operation, orjson.loads(entry.body))
    return usage or None


def _usage_event(operation: str, answer: Any) -> bytes:
    if not isinstance(answer, dict) or not isinstance(answer.get("usage"), dict):
        return b""
    return sse(
        orjson.dumps({**_chunk_base(operation, answer), "choices": [], "usage": answer["usage"]})
    )


def _chunk_base(operation: str, answer: dict[str, Any]) -> dict[str, Any]:
    base = {
        "id": answer.get("id"),
        "object": "chat.completion.chunk" if operation == "chat" else "text_completion",
        "created": answer.get("created"),
        "model": answer.get("model"),
    }
    if "system_fingerprint" in answer:
        base["system_fingerprint"] = answer["system_fingerprint"]
    return base


def _synthesised_chunks(operation: str, answer: dict[str, Any]) -> Iterator[bytes]:
    base = _chunk_base(operation, answer)
    choices = [c for c in answer.get("choices") or () if isinstance(c, dict)]
    for choice in choices:
        index = choice.get("index", 0)
        if operation == "chat":
            msg = choice.get("message") or {}
            delta: dict[str, Any] = {
                "role": msg.get("role", "assistant"),
                "content": msg.get("content"),
            }
            for field in ("tool_calls", "refusal"):
                if msg.get(field) is not None:
                    delta[field] = (
                        [dict(tc, index=i) for i, tc in enumerate(msg[field])]
                        if field == "tool_calls"
                        else msg[field]
                    )
            first = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            last = {
                "index": index,
                "delta": {},
                "logprobs": None,
                "finish_reason": choice.get("finish_reason"),
            }
        else:
            first = {
                "index": index,
                "text": choice.get("text", ""),
                "logprobs": None,
                "finish_reason": None,
            }
            last = {
                "index": index,
                "text": "",
                "logprobs": None,
                "finish_reason": choice.get("finish_reason"),
            }
        yield sse(orjson.dumps({**base, "choices": [first]}))
        yield sse(orjson.dumps({**base, "choices": [last]}))
