"""Batch accounting (docs/spec.md §24, §20): what a batch may cost before it starts, and what
it cost once its results are read.

**Before.** The worst case of a batch, at batch prices (``[[prices]] batch_discount``, 0.5 by
default), is worked out line by line as the rest of the gateway does
(:func:`gateway.budgets.spend.estimate`): each request's body bytes / 4 input tokens, plus its
``max_tokens`` / ``max_completion_tokens`` / ``max_output_tokens``, else the route's
``max_tokens_cap``, else 4096, output tokens — each at its own model's price (:class:`WorstCase`).

**After.** A batch is priced when its results pass through the gateway: the output file's
content (``GET /v1/files/{id}/content``: lines with ``response.body.usage``) or an Anthropic
batch's ``/results`` (lines with ``result.message.usage``), summed line by line as the bytes
pass (:class:`Lines`: only the unfinished line is held), each line at its model's price times the
batch discount (:class:`ResultsTally`).

When the stateful endpoint checks a batch against the caller's budgets, and debits its results
once, is gateway/stateful/batch_checks.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson

from gateway.budgets.spend import Prices, estimate
from gateway.context import Usage

#: a line longer than this is passed on without being parsed (and so unpriced): it would
#: otherwise be held whole
MAX_LINE_BYTES: Final = 16 * 1024 * 1024
#: a batch request's fields that bound its output
_LIMIT_FIELDS: Final = ("max_tokens", "max_completion_tokens", "max_output_tokens")


class Lines:
    """The complete lines of a byte stream, handed to ``on_line`` as its chunks pass; only the
    unfinished line is held (at most :data:`MAX_LINE_BYTES`).

    >>> got = []
    >>> lines = Lines(got.append)
    >>> for chunk in (b'{"a"', b':1}\\n{"b":2}\\n{"c"', b":3}"):
    ...     lines.feed(chunk)
    >>> lines.end(); got
    [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    """

    __slots__ = ("_held", "_on_line", "_skipping")

    def __init__(self, on_line: Callable[[bytes], None]) -> None:
        self._on_line = on_line
        self._held = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> None:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if not self._skipping:
                self._held += chunk[start:end]
                self._emit()
            self._held.clear()
            self._skipping = False
            start = end + 1
        if not self._skipping:
            self._held += chunk[start:]
            if len(self._held) > MAX_LINE_BYTES:
                self._held.clear()
                self._skipping = True

    def end(self) -> None:
        if not self._skipping:
            self._emit()
        self._held.clear()

    def _emit(self) -> None:
        line = bytes(self._held).strip()
        if line:
            self._on_line(line)


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def line_usage(usage: dict[str, Any], anthropic: bool) -> Usage:
    """One result line's usage (docs/spec.md §20): chat/embeddings (``prompt_tokens``),
    Responses (``input_tokens``, OpenAI) or Messages (Anthropic: input = fresh + cache reads +
    cache writes).

    >>> u = line_usage({"prompt_tokens": 10, "completion_tokens": 3}, False)
    >>> u.input, u.output
    (10, 3)
    >>> u = line_usage({"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 4}, True)
    >>> u.input, u.cached_input, u.output
    (7, 2, 4)
    """
    out = Usage()
    if anthropic:
        read = _int(usage.get("cache_read_input_tokens"))
        written = _int(usage.get("cache_creation_input_tokens"))
        out.input = _int(usage.get("input_tokens")) + read + written
        out.output = _int(usage.get("output_tokens"))
        out.parts(read, written, None)
        return out
    if "prompt_tokens" in usage:
        out.input = _int(usage.get("prompt_tokens"))
        out.output = _int(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
    else:
        out.input = _int(usage.get("input_tokens"))
        out.output = _int(usage.get("output_tokens"))
        details = usage.get("input_tokens_details")
    if isinstance(details, dict):
        out.parts(details.get("cached_tokens"), None, None)
    return out


class ResultsTally:
    """The usage and cost of a batch's results, summed as their lines pass."""

    __slots__ = ("anthropic", "cost_usd", "lines", "priced", "prices", "unpriced")

    def __init__(self, prices: Prices, anthropic: bool) -> None:
        self.prices = prices
        self.anthropic = anthropic
        self.lines = Lines(self._line)
        #: lines priced, lines with usage but no price for their model
        self.priced = self.unpriced = 0
        self.cost_usd = 0.0

    def _line(self, raw: bytes) -> None:
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        if not isinstance(line, dict):
            return
        if self.anthropic:
            result = line.get("result")
            body = result.get("message") if isinstance(result, dict) else None
        else:
            response = line.get("response")
            body = response.get("body") if isinstance(response, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("usage"), dict):
            return
        model = body.get("model")
        price = self.prices.of(model) if isinstance(model, str) else None
        if price is None:
            self.unpriced += 1
            return
        self.priced += 1
        usage = line_usage(body["usage"], self.anthropic)
        self.cost_usd += price.cost(usage) * price.batch_discount


class WorstCase:
    """The most a batch may cost, in nano-USD at batch prices, request by request."""

    __slots__ = ("cap", "nano", "prices", "requests", "unpriced")

    def __init__(self, prices: Prices, cap: int | None) -> None:
        self.prices = prices
        self.cap = cap
        self.nano = 0
        self.requests = 0
        #: models named that have no price
        self.unpriced: set[str] = set()

    def add(self, body: Any, size: int, operation: str = "chat") -> None:
        if not isinstance(body, dict):
            return
        self.requests += 1
        model = body.get("model")
        price = self.prices.of(model) if isinstance(model, str) else None
        if price is None:
            self.unpriced.add(str(model))
            return
        most_in, most_out = estimate(size, body, operation, _LIMIT_FIELDS, self.cap)
        self.nano += price.reserve_nano(most_in, most_out, batch=True)


__all__ = ["MAX_LINE_BYTES", "Lines", "ResultsTally", "WorstCase", "line_usage"]
