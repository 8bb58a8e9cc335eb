"""What every mock answer is: a :class:`MockReply` (JSON or SSE events, and the delay before
its headers), the two error shapes (OpenAI's and Anthropic's), SSE framing and the pacing of
streamed tokens."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.mock.engine.knobs import MockSettings


@dataclass(slots=True)
class MockReply:
    status: int
    content_type: str
    #: a JSON body, or None when ``events`` streams SSE
    body: bytes | None = None
    events: AsyncIterator[bytes] | None = None
    #: seconds to wait before the headers
    delay_s: float = 0.0


def _error(
    status: int, message: str, type_: str = "invalid_request_error", param: str | None = None
) -> MockReply:
    body = orjson.dumps(
        {"error": {"message": message, "type": type_, "code": None, "param": param}}
    )
    return MockReply(status, "application/json", body)


#: Anthropic's ``error.type`` per HTTP status (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def _anthropic_error(status: int, message: str) -> MockReply:
    """``{"type": "error", "error": {"type", "message"}, "request_id"}``, as the Messages API."""
    type_ = _ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    body = {
        "type": "error",
        "error": {"type": type_, "message": message},
        "request_id": "req_mock" + os.urandom(12).hex(),
    }
    return MockReply(status, "application/json", orjson.dumps(body))


def _cut_after(model: str) -> int | None:
    """``mock-cut-N`` → N: its streams stop after N tokens, without their end marker."""
    if model.startswith("mock-cut-") and model[9:].isdigit():
        return int(model[9:])
    return None


def _generation_time(settings: MockSettings, tokens: int) -> float:
    pace = tokens / settings.tokens_per_s if settings.tokens_per_s else 0.0
    return settings.ttft_ms / 1000 + pace


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _sent(count: int, cut: int | None) -> int:
    """How many of ``count`` tokens a stream sends (all, or the first N for ``mock-cut-N``)."""
    return count if cut is None else min(count, cut)


def _sse_event(name: str, obj: Any) -> bytes:
    """One SSE event with an ``event:`` line (Responses and Messages streams name their events)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


async def _paced(settings: MockSettings, count: int) -> AsyncIterator[int]:
    """Yield token indexes 0..count-1 at the configured TTFT and pace."""
    if settings.ttft_ms:
        await asyncio.sleep(settings.ttft_ms / 1000)
    interval = 1 / settings.tokens_per_s if settings.tokens_per_s else 0.0
    start = time.monotonic()
    for i in range(count):
        if i and interval:
            # pace against the clock, so sleep overshoot does not accumulate
            await asyncio.sleep(max(0.0, start + i * interval - time.monotonic()))
        yield i
