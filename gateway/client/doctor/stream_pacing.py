"""The ``streaming`` row: a ``stream: true`` chat completion; every SSE event is time-stamped by
the read that brought it: content type, no Content-Length, TTFT, inter-event gaps p50/p99,
``[DONE]``, and whether the events came bunched after a long wait (something buffered them)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import orjson

from gateway.client.doctor.report import Check, Verdict
from gateway.client.doctor.timed_client import (
    RequestFailed,
    TimedAnswer,
    TimedClient,
    chat_body,
    nonce,
    uncacheable,
)
from gateway.streaming.sse import DONE, SSEParser, event_data

__all__ = ["StreamShape", "check_streaming", "stream_shape"]

#: fewer stream events than this cannot show whether they were paced or bunched
STREAM_MIN_EVENTS: Final = 4
#: small enough to be cheap on a paid API, long enough to show the pacing
STREAM_MAX_TOKENS: Final = 32


@dataclass(frozen=True, slots=True)
class StreamShape:
    """What the arrival times of a stream's SSE ``data:`` events say."""

    #: seconds from sending the request to each data event's read
    arrivals: list[float]
    #: seconds to the first event carrying content (None: no content event)
    ttft: float | None
    done: bool

    @property
    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]

    def bunched(self, wait_ms: float, ratio: float) -> bool:
        """Events that arrive all together after a long wait: something held them back."""
        if len(self.arrivals) < STREAM_MIN_EVENTS:
            return False
        wait = self.arrivals[0] * 1000
        spread = (self.arrivals[-1] - self.arrivals[0]) * 1000
        return wait >= wait_ms and spread < ratio * wait


def stream_shape(reads: Sequence[tuple[float, bytes]]) -> StreamShape:
    """Split decoded reads into SSE events (:class:`~gateway.streaming.sse.SSEParser`, the
    gateway's own: lines end with LF, CRLF or CR); each event gets the time of the read that
    completed it.

    >>> s = stream_shape([(0.5, b'data: {"choices": [{"delta": {"content": "a"}}]}\\n\\n'),
    ...                   (0.6, b"data: [DONE]\\r\\r")])
    >>> s.arrivals, s.ttft, s.done
    ([0.5, 0.6], 0.5, True)
    """
    parser = SSEParser()
    stamped: list[tuple[float, bytes]] = []
    last = 0.0
    for at, data in reads:
        # a blank line ended by a CR at the end of the last read: its event was complete then,
        # the parser only waited to see whether an LF followed (CRLF)
        held = parser.pending[-2:] in (b"\r\r", b"\n\r")
        events = parser.feed(data)
        stamped += [(last if i == 0 and held else at, raw) for i, raw in enumerate(events)]
        last = at
    stamped += [(last, raw) for raw in parser.finish()]
    arrivals: list[float] = []
    ttft: float | None = None
    done = False
    for at, raw in stamped:
        payload = event_data(raw)
        if payload is None:
            continue  # a comment or keep-alive
        arrivals.append(at)
        if payload == DONE:
            done = True
        elif ttft is None and _has_content(payload):
            ttft = at
    return StreamShape(arrivals, ttft, done)


def _has_content(payload: bytes) -> bool:
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
            return True
        if choice.get("text"):
            return True
    return False


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def check_streaming(
    client: TimedClient, model: str, th: Mapping[str, float]
) -> tuple[Check, TimedAnswer | None]:
    limit = th["streaming"]
    prompt = f"gateway doctor {nonce()}: count from 1 to 40, one number per line."
    body = chat_body(model, prompt, STREAM_MAX_TOKENS, stream=True)
    headers = {**uncacheable(), "accept": "text/event-stream"}
    try:
        answer = client.fetch("POST", "/chat/completions", body, headers, keep_reads=True)
    except RequestFailed as exc:
        return Check("streaming", None, "ms", limit, "fail", str(exc)), None
    if not answer.ok:
        return Check("streaming", None, "ms", limit, "fail", client.error(answer)), answer
    content_type = answer.headers.get("content-type", "")
    if not content_type.lower().startswith("text/event-stream"):
        hint = f"stream: true was answered as {content_type or 'no content type'}, not SSE"
        return Check("streaming", None, "ms", limit, "fail", hint), answer
    shape = stream_shape(answer.reads)
    if not shape.arrivals:
        return Check("streaming", None, "ms", limit, "fail", "the stream had no data events"), (
            answer
        )
    ttft = shape.ttft if shape.ttft is not None else shape.arrivals[0]
    gaps = shape.gaps_ms
    parts = [f"{len(shape.arrivals)} events"]
    if gaps:
        parts.append(f"gaps p50 {_percentile(gaps, 50):.1f} ms p99 {_percentile(gaps, 99):.1f} ms")
    spread = (shape.arrivals[-1] - shape.arrivals[0]) * 1000
    parts.append(f"first event {shape.arrivals[0] * 1000:.0f} ms, all within {spread:.0f} ms")
    parts.append("[DONE]" if shape.done else "no [DONE]")
    if len(shape.arrivals) < STREAM_MIN_EVENTS:
        parts.append("too few events to judge buffering")
    detail = ", ".join(parts)
    value = ttft * 1000

    def row(verdict: Verdict, hint: str) -> tuple[Check, TimedAnswer]:
        return Check("streaming", value, "ms", limit, verdict, hint, detail), answer

    if "content-length" in answer.headers:
        return row("fail", "the stream came with a Content-Length: it was buffered whole")
    if shape.bunched(th["bunch_wait"], th["bunch_ratio"]):
        return row(
            "fail",
            "events arrived bunched after a long wait: something buffers the stream; disable "
            "proxy buffering (X-Accel-Buffering: no, nginx proxy_buffering off) and flush "
            "compression after every event",
        )
    if not shape.done:
        return row(
            "fail", "the stream ended without data: [DONE]: cut by the server or a proxy timeout"
        )
    if value > limit:
        return row(
            "warn",
            "the first token is slow: a shorter prompt, a smaller or less loaded model, a "
            "closer backend",
        )
    return row("ok", "")
