"""A fault-injecting OpenAI-compatible upstream, toxiproxy's toxics as the model.

Each request picks its fault with the ``x-fault`` header (the gateway forwards it like any
other request header), so a client knows what it asked for and can check what it got::

    x-fault: latency=200        wait 200 ms (±10 %) before the answer            (toxiproxy latency)
    x-fault: reset              reset (RST) in the middle of the body            (reset_peer)
    x-fault: timeout=30         never answer; close after 30 s                   (timeout)
    x-fault: slicer=7           the answer in 7-byte writes, 1 ms apart          (slicer)
    x-fault: limit_data=300     close (FIN) after 300 bytes of the answer        (limit_data)
    x-fault: drip=50            a stream: one event per 50 ms; JSON: 64 B per 50 ms (bandwidth)
    x-fault: status=503         answer 503 (any status) with an OpenAI error body
    x-fault: big=1073741824     a stream of that many content bytes (16 KiB events)

``words=N`` (in the same header, comma separated) sets the answer's length. A request without
the header gets the server's ``default`` fault (none unless set: a clean answer), so two
backends of one route can behave differently for the same request (one slow, one failing), and a
test can change a backend's behaviour while it runs by assigning ``default``. Server-wide 5xx
bursts (``burst_every``/``burst_for``) answer 503 to every request for the last ``burst_for``
seconds of every ``burst_every`` — the way a backend under a deploy or an overload behaves.

In tests: ``FaultServer(FaultyUpstream().handler)``; for the soak, its own process:
``python -m tests.faults --port P [--burst-every S --burst-for S] [--default FAULT]``
(stopped by SIGTERM; ``--stats-every S`` prints what it saw by fault kind every S seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import orjson

from tests.support import (
    LAST_CHUNK,
    ScriptedUpstream,
    SeenRequest,
    chat_chunk,
    chunk,
    http_response,
    sse_head,
)

WORDS = ("alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta", " theta")
BIG_EVENT_CONTENT = 16 * 1024


@dataclass
class Fault:
    """One request's toxic (name and argument) and answer length."""

    name: str = "none"
    arg: float = 0.0
    words: int = 8

    @classmethod
    def parse(cls, header: str | None) -> Fault:
        fault = cls()
        for part in (header or "").split(","):
            name, _, value = part.strip().partition("=")
            if not name:
                continue
            if name == "words":
                fault.words = int(value)
            else:
                fault.name, fault.arg = name, float(value or 0)
        return fault


@dataclass
class FaultyUpstream:
    """The handler behind a :class:`~tests.support.ScriptedUpstream`, with its counters."""

    burst_every: float = 0.0
    burst_for: float = 0.0
    #: the fault of a request without ``x-fault`` (``"status=503"``, ``"latency=300"``, …)
    default: str = ""
    seen: dict[str, int] = field(default_factory=dict)
    _started: float = field(default_factory=time.monotonic)

    def in_burst(self) -> bool:
        if not self.burst_every:
            return False
        # at the end of each period: a fresh server answers before its first burst
        phase = (time.monotonic() - self._started) % self.burst_every
        return phase >= self.burst_every - self.burst_for

    async def handler(self, req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        fault = Fault.parse(req.header("x-fault") or self.default)
        kind = fault.name
        if self.in_burst():
            fault, kind = Fault("status", 503), "burst"
        self.seen[kind] = self.seen.get(kind, 0) + 1
        stream = _wants_stream(req.body)
        if fault.name == "latency":
            await asyncio.sleep(fault.arg / 1000 * random.uniform(0.9, 1.1))
        elif fault.name == "timeout":
            await asyncio.sleep(fault.arg or 30)
            return False
        elif fault.name == "status":
            body = orjson.dumps(
                {"error": {"message": "injected", "type": "server_error", "code": None}}
            )
            writer.write(http_response(int(fault.arg), body))
            return True
        elif fault.name == "big":
            await _big_stream(writer, int(fault.arg))
            return True
        answer = _stream_bytes(fault.words) if stream else _json_bytes(fault.words)
        return await _deliver(fault, answer, writer, stream)


async def _deliver(fault: Fault, answer: bytes, writer: asyncio.StreamWriter, stream: bool) -> bool:
    if fault.name == "reset":
        writer.write(answer[: len(answer) // 2])
        await writer.drain()
        reset(writer)
        return False
    if fault.name == "limit_data":
        writer.write(answer[: int(fault.arg)])
        await writer.drain()
        return False
    if fault.name == "slicer":
        size = max(1, int(fault.arg or 7))
        for i in range(0, len(answer), size):
            writer.write(answer[i : i + size])
            await writer.drain()
            await asyncio.sleep(0.001)
        return True
    if fault.name == "drip":
        await _drip(answer, writer, stream, fault.arg / 1000)
        return True
    writer.write(answer)
    return True


async def _drip(answer: bytes, writer: asyncio.StreamWriter, stream: bool, gap: float) -> None:
    if stream:  # one chunk (one event) at a time: split at the chunked framing
        head, _, rest = answer.partition(b"\r\n\r\n")
        writer.write(head + b"\r\n\r\n")
        pieces = [p + b"\n\n\r\n" for p in rest.split(b"\n\n\r\n") if p]
    else:
        pieces = [answer[i : i + 64] for i in range(0, len(answer), 64)]
    for piece in pieces:
        await writer.drain()
        await asyncio.sleep(gap)
        writer.write(piece)


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST instead of FIN (SO_LINGER 0), like toxiproxy's reset_peer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _wants_stream(body: bytes) -> bool:
    try:
        return orjson.loads(body).get("stream") is True
    except (orjson.JSONDecodeError, AttributeError):
        return False


def _content(words: int) -> list[str]:
    return [WORDS[i % len(WORDS)] for i in range(words)]


def _json_bytes(words: int) -> bytes:
    text = "".join(_content(words))
    body = orjson.dumps(
        {
            "id": "chatcmpl-fault",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": words, "total_tokens": words + 1},
        }
    )
    return http_response(200, body)


def _stream_bytes(words: int) -> bytes:
    parts = [sse_head()]
    parts += [chunk(chat_chunk(w)) for w in _content(words)]
    parts.append(chunk(chat_chunk(None, finish="stop")))
    parts.append(chunk(b"data: [DONE]\n\n"))
    parts.append(LAST_CHUNK)
    return b"".join(parts)


def expected_text(words: int) -> str:
    """What a complete answer's content is for ``words=N``."""
    return "".join(_content(words))


async def _big_stream(writer: asyncio.StreamWriter, total: int) -> None:
    event = chunk(chat_chunk("x" * BIG_EVENT_CONTENT))
    writer.write(sse_head())
    sent = 0
    while sent < total:
        writer.write(event)
        sent += BIG_EVENT_CONTENT
        await writer.drain()
    writer.write(chunk(chat_chunk(None, finish="stop")) + chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
    await writer.drain()


class FaultServer(ScriptedUpstream):
    """A :class:`~tests.support.ScriptedUpstream` whose listen backlog takes thousands of
    connections at once (asyncio's default of 100 would make the kernel drop SYNs)."""

    backlog = 4096
    #: the handler's counters, when it is a FaultyUpstream's (set by whoever made both)
    seen: dict[str, int]

    @property
    def open_connections(self) -> int:
        return self.connections - self.closed_connections


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--burst-every", type=float, default=0.0, help="s between 503 bursts")
    p.add_argument("--burst-for", type=float, default=0.0, help="s each burst lasts")
    p.add_argument("--default", default="", help="the fault of a request without x-fault")
    args = p.parse_args()
    faults = FaultyUpstream(args.burst_every, args.burst_for, args.default)
    server = FaultServer(faults.handler)
    server.port = args.port
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    print(f"faults: http://127.0.0.1:{args.port}/v1", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while not stop.wait(0.5):
            server.requests.clear()  # a long soak: keep the upstream's own memory flat
    server.stop()
    # what it saw, by fault kind ("burst": answered 503 by a burst), for whoever started it
    print("faults: seen " + orjson.dumps(faults.seen).decode(), flush=True)


if __name__ == "__main__":
    main()
