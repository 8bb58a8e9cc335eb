"""Upstreams and configs for the Responses and Messages API tests (tests/test_responses.py,
tests/test_messages.py).

- :func:`engine_upstream`: a :class:`~tests.support.ScriptedUpstream` handler answering with the
  mock engine (real protocol bodies and streams), so a test can read what each upstream received;
- :func:`paced`: an upstream sending given SSE events ``gap`` seconds apart, recording when each
  left (the unbuffered-stream proof);
- :func:`scripted_stream`: events, then a fault (an end without the end marker, a reset, a stall);
- :func:`two_routes`: ``claude-*`` -> an ``anthropic`` backend, ``gpt-*`` -> an ``openai`` one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx2
import orjson

from gateway.config import Config
from gateway.mock.engine import MockSettings, reply
from tests.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.support import (
    LAST_CHUNK,
    Handler,
    SeenRequest,
    chunk,
    gateway_config,
    http_response,
    sse_head,
)

GAP_S = 0.3
WORDS = ["Named", " events", " arrive", " one", " by", " one"]


def engine_upstream(settings: MockSettings | None = None) -> Handler:
    """Answer every request as ``gateway mock-upstream`` would, over this scripted server."""

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        path = req.target.split("?", 1)[0].removeprefix("/v1")
        r = reply(req.method, path, req.body, settings)
        if r.delay_s:
            await asyncio.sleep(r.delay_s)
        if r.events is None:
            writer.write(http_response(r.status, r.body or b"", r.content_type))
            return True
        writer.write(sse_head())
        async for event in r.events:
            writer.write(chunk(event))
            await writer.drain()
        writer.write(LAST_CHUNK)
        return True

    return handler


def sse(name: str, obj: dict[str, Any]) -> bytes:
    return f"event: {name}\n".encode() + b"data: " + orjson.dumps(obj) + b"\n\n"


def paced(events: list[bytes], sent_at: list[float], gap: float = GAP_S) -> Handler:
    """Send ``events`` one every ``gap`` seconds (the first with the headers), then end the body;
    ``sent_at[i]`` is taken just before event i is written: no byte of it left earlier, and the
    time is on record before the client can have the event (a stamp after the write raced a
    client that finished reading first)."""

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head())
        for i, event in enumerate(events):
            if i:
                await asyncio.sleep(gap)
            sent_at.append(time.monotonic())
            writer.write(chunk(event))
            await writer.drain()
        writer.write(LAST_CHUNK)
        return True

    return handler


def scripted_stream(events: list[bytes], fault: str, stall_s: float = 2.0) -> Handler:
    """``events``, then: ``end`` (a clean end of body, no end marker), ``reset`` (the connection
    aborted mid-body) or ``stall`` (nothing more for ``stall_s``)."""

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head() + b"".join(chunk(e) for e in events))
        await writer.drain()
        await asyncio.sleep(0.05)
        if fault == "end":
            writer.write(LAST_CHUNK)
            return True
        if fault == "reset":
            writer.transport.abort()
            return False
        await asyncio.sleep(stall_s)
        return False

    return handler


# ---------------------------------------------------------------- protocol streams


def responses_events(words: list[str], *, end: str | None = "response.completed") -> list[bytes]:
    """A Responses API stream (what the openai SDK parses); ``end=None`` leaves it unfinished."""
    base = {"id": "resp_t1", "object": "response", "created_at": 1, "model": "gpt-test"}
    where = {"item_id": "msg_t1", "output_index": 0, "content_index": 0}
    started = dict(base, status="in_progress", output=[], usage=None)
    objs: list[dict[str, Any]] = [{"type": "response.created", "response": started}]
    objs += [
        {"type": "response.output_text.delta", **where, "delta": w, "logprobs": []} for w in words
    ]
    if end is not None:
        status = end.removeprefix("response.")
        usage = {"input_tokens": 11, "output_tokens": len(words), "total_tokens": 11 + len(words)}
        message = {
            "id": "msg_t1",
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": "".join(words), "annotations": []}],
        }
        objs.append(
            {"type": end, "response": dict(base, status=status, output=[message], usage=usage)}
        )
    return [sse(o["type"], {**o, "sequence_number": i}) for i, o in enumerate(objs)]


def messages_events(words: list[str], *, end: bool = True) -> list[bytes]:
    """An Anthropic Messages stream; ``end=False`` stops before ``message_stop``."""
    message = {
        "id": "msg_t1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 9,
            "cache_read_input_tokens": 4,
            "cache_creation_input_tokens": 2,
            "output_tokens": 1,
        },
    }

    def ev(name: str, **fields: Any) -> bytes:
        return sse(name, {"type": name, **fields})

    events = [
        ev("message_start", message=message),
        ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
    ]
    events += [
        ev("content_block_delta", index=0, delta={"type": "text_delta", "text": w}) for w in words
    ]
    if end:
        events += [
            ev("content_block_stop", index=0),
            ev(
                "message_delta",
                delta={"stop_reason": "end_turn", "stop_sequence": None},
                usage={"output_tokens": len(words)},
            ),
            ev("message_stop"),
        ]
    return events


# ---------------------------------------------------------------- configs


def two_routes(
    claude_url: str,
    gpt_url: str,
    mock_to: str = "gpt",
    extra: str = "",
    route_extra: str = "",
) -> Config:
    """``claude-*`` -> backend ``claude`` (provider anthropic), ``gpt-*`` -> backend ``gpt``
    (provider openai); the mock engine's special models (``mock-*``) go to ``mock_to``.
    ``route_extra`` is added to the claude and gpt routes (policies); ``extra`` at the end."""
    return gateway_config(
        f"""
[[backends]]
name = "claude"
url = "{claude_url}"
provider = "anthropic"
api_key_env = "TEST_BACKEND_KEY"
stream_idle_timeout_s = 0.5

[[backends]]
name = "gpt"
url = "{gpt_url}"
provider = "openai"
api_key_env = "TEST_BACKEND_KEY"
stream_idle_timeout_s = 0.5

[[routes]]
name = "claude"
models = ["claude-*"]
backends = ["claude"]
{route_extra}

[[routes]]
name = "gpt"
models = ["gpt-*"]
backends = ["gpt"]
{route_extra}

[[routes]]
name = "mock"
models = ["mock-*"]
backends = ["{mock_to}"]
retries = 0
{extra}
"""
    )


def traced(receiver_endpoint: str) -> str:
    """The ``[tracing]`` section exporting every span to an OTLP receiver, quickly."""
    return f"""
[tracing]
exporter = "otlp"
endpoint = "{receiver_endpoint}"
sample_ratio = 1.0
schedule_delay_ms = 50
"""


# ---------------------------------------------------------------- reading what came back


def raw_events(url: str, payload: dict[str, Any], **headers: str) -> list[bytes]:
    """POST a stream request and return its SSE events as the client received them."""
    with httpx2.stream("POST", url, json=payload, headers=headers, timeout=20) as resp:
        assert resp.status_code == 200
        body = resp.read()
    assert body.endswith(b"\n\n")
    return [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]


def trace_of(receiver: OTLPReceiver, headers: Any, count: int) -> dict[str, ReceivedSpan]:
    """The spans (by name) of the trace a response names in ``traceresponse``."""
    trace_id = headers["traceresponse"].split("-")[1]
    receiver.wait_for(lambda _: len(receiver.trace(trace_id)) >= count)
    return {s.name: s for s in receiver.trace(trace_id)}


def metric_lines(base: str, name: str) -> list[str]:
    """The sample lines of one metric on ``base``/metrics."""
    text = httpx2.get(base + "/metrics", timeout=10).text
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def metric_value(lines: list[str], **labels: str) -> float:
    """The value of the one sample carrying all ``labels`` (0 when there is none)."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    found = [x for x in lines if all(w in x for w in want)]
    assert len(found) <= 1, found
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0
