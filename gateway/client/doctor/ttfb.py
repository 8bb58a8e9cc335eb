"""The ``ttfb`` row: a small non-streamed chat completion, headers sent to headers received."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.client.doctor.report import Check, judge
from gateway.client.doctor.timed_client import (
    RequestFailed,
    TimedAnswer,
    TimedClient,
    chat_body,
    nonce,
    uncacheable,
)

__all__ = ["check_ttfb"]

#: small enough to be cheap on a paid API, big enough to measure
TTFB_MAX_TOKENS: Final = 16


def check_ttfb(
    client: TimedClient, model: str, th: Mapping[str, float]
) -> tuple[Check, TimedAnswer | None]:
    limit = th["ttfb"]
    body = chat_body(
        model, f"gateway doctor {nonce()}: say hello in one sentence.", TTFB_MAX_TOKENS
    )
    try:
        answer = client.fetch("POST", "/chat/completions", body, uncacheable())
    except RequestFailed as exc:
        return Check("ttfb", None, "ms", limit, "fail", str(exc)), None
    ms = answer.ttfb * 1000
    detail = f"HTTP {answer.status}, {len(answer.body)} B, max_tokens {TTFB_MAX_TOKENS}"
    if not answer.ok:
        return Check("ttfb", ms, "ms", limit, "fail", client.error(answer), detail), answer
    hint = (
        "a non-streamed answer waits for the whole generation: stream: true, a lower "
        "max_tokens, or a closer / less loaded backend"
    )
    return judge("ttfb", ms, limit, detail, hint), answer
