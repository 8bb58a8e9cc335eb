"""The mock's knobs (latency, time to first token, pace, answer length, capacity): from a
``mock://`` URL, the ``mock-upstream`` flags, or per request from ``x-mock-*`` headers."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gateway.mock.capacity import Capacity, in_process

DEFAULT_COMPLETION_TOKENS = 12
MAX_COMPLETION_TOKENS = 4096

#: knob name → request header (the query keys of ``mock://`` are the knob names)
_KNOB_HEADERS = {
    "latency_ms": "x-mock-latency-ms",
    "ttft_ms": "x-mock-ttft-ms",
    "tokens_per_s": "x-mock-tokens-per-s",
    "output_tokens": "x-mock-output-tokens",
}


@dataclass(frozen=True, slots=True)
class MockSettings:
    latency_ms: float = 0.0
    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0
    #: the length of an answer the request does not limit
    output_tokens: int = DEFAULT_COMPLETION_TOKENS
    #: a model server's bounded batch and queue (None: every request runs at once)
    capacity: Capacity | None = None

    @classmethod
    def from_url(cls, url: str) -> MockSettings:
        """``mock://?ttft_ms=50&tokens_per_s=100`` → settings (unknown knobs are errors);
        ``capacity=N`` names an in-process server with N slots (gateway/mock/capacity.py)."""
        values = dict(parse_qsl(urlsplit(url).query))
        if values.pop("capacity", None) is None:
            return cls().with_overrides(values)
        return cls(capacity=in_process(url)).with_overrides(values)

    def with_overrides(self, values: Mapping[str, str]) -> MockSettings:
        changes: dict[str, Any] = {}
        for key, raw in values.items():
            if key not in _KNOB_HEADERS:
                known = ", ".join(sorted(_KNOB_HEADERS))
                raise ValueError(f"unknown mock knob {key!r} (known: {known})")
            if key == "output_tokens":
                try:
                    count = int(raw)
                except ValueError:
                    raise ValueError(f"mock knob {key} must be an integer") from None
                if not 1 <= count <= MAX_COMPLETION_TOKENS:
                    raise ValueError(f"mock knob {key} must be in 1..{MAX_COMPLETION_TOKENS}")
                changes[key] = count
                continue
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"mock knob {key} must be a number") from None
            if not 0 <= value < math.inf:
                raise ValueError(f"mock knob {key} must be a finite number >= 0")
            changes[key] = value
        return replace(self, **changes) if changes else self

    def from_headers(self, headers: Mapping[str, str]) -> MockSettings:
        values = {key: headers[h] for key, h in _KNOB_HEADERS.items() if h in headers}
        return self.with_overrides(values) if values else self
