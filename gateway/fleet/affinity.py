"""Affinity: a session or a prompt prefix keeps its backend (docs/spec.md §21).

A model server reuses the KV cache of a prompt prefix it has seen (vLLM's automatic prefix
caching, SGLang's radix cache), and so does a provider's prompt cache: requests that share a
prefix are faster and cheaper on the backend that saw it first. A route with ``affinity`` sends
each request's key to one backend by rendezvous hashing (highest random weight): every backend
gets a score from the key and its name, the highest wins. So a key keeps its backend while the
fleet is stable, every gateway replica picks the same one (the hash is not Python's salted
``hash``), and when a backend leaves only its keys move, each to its next in hash order; the
others stay put. The health hop (:meth:`gateway.fleet.health.Health.order`) takes the hash order
over the backends that are healthy and unsaturated: a saturated or ejected preferred backend
spills to the next.

The key (:func:`request_key`):

- ``session``: ``prompt_cache_key`` (OpenAI), ``metadata.user_id`` (Anthropic; Claude Code puts
  its session there), the ``user`` field, or an ``x-session-id`` header — the first present;
  none: no affinity for this request;
- ``prefix``: those, else the model and the first 2 KiB of the prompt (system prompt,
  instructions, the earliest messages), so requests that share their opening share a backend.

Cost per request: a few dict lookups, one BLAKE2b of at most 2 KiB and a 64-bit mix per backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from gateway.headers import header_value
from gateway.routes import Backend
from gateway.types import RawHeaders

#: how much of the prompt a prefix key covers
PREFIX_BYTES = 2048
_MASK = (1 << 64) - 1
_SESSION_HEADER = b"x-session-id"


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


#: one multiply-xorshift round (MurmurHash3's fmix constant): a key's and a backend's hashes,
#: both already uniform, combined into a score whose order no single bit decides
_MULTIPLIER = 0xFF51AFD7ED558CCD


class Rendezvous:
    """The backends of one route in hash order for a key (made once per route).

    >>> class B:
    ...     def __init__(self, name): self.name = name
    >>> r = Rendezvous([B("a"), B("b"), B("c")])
    >>> [b.name for b in r.rank(_hash64(b"k"))] == [b.name for b in r.rank(_hash64(b"k"))]
    True
    """

    __slots__ = ("_nodes",)

    def __init__(self, backends: Sequence[Backend]) -> None:
        self._nodes = tuple((_hash64(b.name.encode()), b) for b in backends)

    def rank(self, key: int) -> list[Backend]:
        """Every backend, the key's preferred first, then where it would spill, in order."""
        scored = []
        for node, backend in self._nodes:
            x = ((key ^ node) * _MULTIPLIER) & _MASK
            scored.append((x ^ (x >> 29), backend))
        scored.sort(key=_first, reverse=True)
        return [b for _, b in scored]


def _first(pair: tuple[int, Backend]) -> int:
    return pair[0]


def session_id(payload: dict[str, Any], headers: RawHeaders) -> str | None:
    """The session a request names: ``prompt_cache_key``, ``metadata.user_id``, ``user`` or
    the ``x-session-id`` header (the first present and not empty)."""
    value = payload.get("prompt_cache_key")
    if type(value) is str and value:
        return value
    metadata = payload.get("metadata")
    if type(metadata) is dict:
        value = metadata.get("user_id")
        if type(value) is str and value:
            return value
    value = payload.get("user")
    if type(value) is str and value:
        return value
    raw = header_value(headers, _SESSION_HEADER)
    return raw.decode("latin-1") if raw else None


def prompt_prefix(payload: dict[str, Any], limit: int = PREFIX_BYTES) -> bytes:
    """The first ``limit`` bytes of the prompt's text: system prompt, instructions, then the
    messages (or input, or prompt) from the earliest, their text parts only.

    >>> prompt_prefix({"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}]})
    b'Be brief.\\x00hi'
    >>> len(prompt_prefix({"prompt": "x" * 5000}))
    2048
    """
    parts: list[str] = []
    room = limit
    for field in _PROMPT_FIELDS:
        value = payload.get(field)
        if value is not None:
            room = _collect(value, parts, room, 0)
            if room <= 0:
                break
    return "\x00".join(parts).encode()[:limit]


_PROMPT_FIELDS = ("system", "instructions", "messages", "input", "prompt")


def _collect(value: Any, parts: list[str], room: int, depth: int) -> int:
    """Append the text of ``value`` to ``parts``; the room (chars) left."""
    if type(value) is str:
        parts.append(value[:room])
        return room - len(value)
    if depth > 3:
        return room
    if type(value) is list:
        for item in value:
            room = _collect(item, parts, room, depth + 1)
            if room <= 0:
                break
    elif type(value) is dict:
        inner = value.get("content")
        if inner is None:
            inner = value.get("text")
        if inner is not None:
            room = _collect(inner, parts, room, depth + 1)
    return room


def request_key(
    mode: str, payload: dict[str, Any], model: str | None, headers: RawHeaders
) -> int | None:
    """The request's affinity key under ``mode`` (``session`` or ``prefix``), or None when
    it has none (a session mode request that names no session)."""
    session = session_id(payload, headers)
    if session is not None:
        return _hash64(b"s\x00" + session.encode())
    if mode != "prefix":
        return None
    prefix = prompt_prefix(payload)
    return _hash64(b"p\x00" + (model or "").encode() + b"\x00" + prefix)


__all__ = ["PREFIX_BYTES", "Rendezvous", "prompt_prefix", "request_key", "session_id"]
