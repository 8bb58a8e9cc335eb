"""An independent realtime upstream for the tests: ``websockets``' own asyncio server in a
thread, speaking the Realtime API's text events, with behaviours chosen by the model name.

Models (the ``model`` query parameter the gateway passes on):

- anything else: a session (``session.created``; ``response.create`` → ``response.created``,
  ``deltas`` ``response.output_text.delta`` events ``pace_s`` apart (0 by default),
  ``response.done`` with usage, its ``event_id`` before its ``type``); ``echo`` is relayed back
  verbatim (text and binary) for any other event;
- ``refuse-NNN``: the handshake answered with HTTP status NNN and an OpenAI error body
  (``refuse-NNN-after-S``: with ``Retry-After: S``, one header per ``after-S``);
- ``close-CODE``: after the first client message, a close frame CODE "upstream says bye";
- ``drop``: after the first client message, the TCP connection aborted (no close frame);
- ``big-N``: after the first client message, one text message of N bytes;
- ``flood-N-SIZE``: after the first client message, N binary messages of SIZE bytes as fast as
  the connection takes them (each starts with its index, 4 bytes big-endian); ``Seen.sent_at``
  gets a stamp as each send returns, and ``Seen.blocked`` tells whether a send waits now;
- ``stall``: nothing is read from the gateway until :meth:`RealtimeUpstream.release`; the
  socket's receive buffer is small, so the gateway's writes soon wait;
- ``badtext``: after the first client message, a text frame that is not UTF-8.
- ``busy``: a ``response.create`` is refused with an ``error`` event (:data:`BUSY`);
- ``vad``: server VAD — an ``input_audio_buffer.append`` is answered, :data:`VAD_PAUSE_S` later,
  by ``input_audio_buffer.committed`` and :data:`VAD_PAUSE_S` after that by a response, with
  no ``response.create`` from the client.

Every handshake (path, headers, offered subprotocols) and every session's messages and the close
the gateway sent are recorded for the test to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tests.support import free_port

#: the key the test configs make the gateway send upstream (tests/conftest.py sets it)
BACKEND_KEY = "sk-backend-secret-for-tests"
#: model "busy": what a response.create gets (no response follows)
BUSY = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "code": "conversation_already_has_active_response",
        "message": "Conversation already has an active response in progress",
    },
}
#: model "vad": the pause before the commit, and between the commit and the response
VAD_PAUSE_S = 0.3


@dataclass
class Seen:
    """One session as the upstream saw it."""

    path: str
    headers: list[tuple[str, str]]
    offered: list[str]
    selected: str | None = None
    received: list[str | bytes] = field(default_factory=list)
    #: (code, reason) of the close the upstream received, or None (no close frame)
    close: tuple[int, str] | None = None
    #: perf_counter() when the connection ended, and when each delta was about to be sent
    ended_at: float | None = None
    sent_at: list[float] = field(default_factory=list)
    #: flood-N-SIZE: a send waits for the gateway to read
    blocked: bool = False

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def model(self) -> str:
        return parse_qs(urlsplit(self.path).query).get("model", [""])[0]


#: the id the test upstream gives every session (its ``session.created``)
SESSION_ID = "sess_test_0001"


class RealtimeUpstream:
    """A realtime backend on 127.0.0.1 (its own event loop, in a thread)."""

    def __init__(self, deltas: int = 3, pace_s: float = 0.0, select: str | None = "realtime"):
        self.port = free_port()
        self.deltas = deltas
        self.pace_s = pace_s
        #: the subprotocol to select when the client offers it (None: select none)
        self.select = select
        self.sessions: list[Seen] = []
        self.handshakes: list[Seen] = []
        self._ended = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Future[None] | None = None
        self._stalled: list[Any] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> RealtimeUpstream:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("realtime upstream did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(10)

    def release(self) -> None:
        """``stall`` sessions: read from the gateway again."""

        def resume() -> None:
            for transport in self._stalled:
                transport.resume_reading()

        self._loop.call_soon_threadsafe(resume)

    def __enter__(self) -> RealtimeUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ended(self, count: int = 1, timeout: float = 5.0) -> list[Seen]:
        """The first ``count`` sessions once each has ended (bounded)."""
        deadline = time.monotonic() + timeout
        with self._ended:
            while sum(1 for s in self.sessions if s.ended_at is not None) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{count} upstream sessions did not end in {timeout} s")
                self._ended.wait(left)
        return self.sessions[:count]

    # ------------------------------------------------------------ the server

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = self._loop.create_future()
        async with serve(
            self._session,
            "127.0.0.1",
            self.port,
            process_request=self._handshake,
            select_subprotocol=self._select,
            compression=None,
            max_size=None,
        ):
            self._ready.set()
            await self._stop

    def _select(self, conn: ServerConnection, offered: list[Any]) -> Any:
        return self.select if self.select in offered else None

    def _handshake(self, conn: ServerConnection, request: Request) -> Response | None:
        offered = [
            p.strip()
            for h in request.headers.get_all("Sec-WebSocket-Protocol")
            for p in h.split(",")
        ]
        seen = Seen(request.path, list(request.headers.raw_items()), offered)
        self.handshakes.append(seen)
        model = seen.model
        if model.startswith("refuse-"):
            _, code, *after = model.split("-")
            status = int(code)
            body = orjson.dumps(
                {
                    "error": {
                        "message": f"upstream refuses with {status}",
                        "type": "server_error",
                        "code": f"refused_{status}",
                        "param": None,
                    }
                }
            )
            headers = Headers([("Content-Type", "application/json")])
            for i in range(0, len(after) - 1, 2):  # each "after-S" pair: one more header
                if after[i] == "after":
                    headers["Retry-After"] = after[i + 1]
            return Response(status, "Refused", headers, body)
        return None

    async def _session(self, conn: ServerConnection) -> None:
        seen = self.handshakes[-1]
        seen.selected = conn.subprotocol
        self.sessions.append(seen)
        model = seen.model
        if model == "stall":
            assert conn.transport is not None
            sock = conn.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 18)
            conn.transport.pause_reading()
            self._stalled.append(conn.transport)
        try:
            await conn.send(
                orjson.dumps({"type": "session.created", "session": {"id": SESSION_ID}}).decode()
            )
            async for message in conn:
                seen.received.append(message)
                if await self._behave(conn, seen, model, message):
                    break
        except ConnectionClosed:
            pass
        finally:
            rcvd = conn.protocol.close_rcvd
            seen.close = (rcvd.code, rcvd.reason) if rcvd is not None else None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)
            seen.ended_at = time.perf_counter()
            with self._ended:
                self._ended.notify_all()

    async def _behave(self, conn: ServerConnection, seen: Seen, model: str, message: Any) -> bool:
        """One client message; True when the session is over."""
        if model.startswith("close-"):
            await conn.close(int(model.split("-")[1]), "upstream says bye")
            return True
        if model == "drop":
            assert conn.transport is not None
            conn.transport.abort()
            return True
        if model.startswith("big-"):
            await conn.send("x" * int(model.split("-")[1]))
            return False
        if model.startswith("flood-") and len(seen.received) == 1:
            _, count, size = model.split("-")
            await self._flood(conn, seen, int(count), int(size))
            return False
        if model == "badtext":
            await conn.send(b"\xff\xfe not UTF-8", text=True)
            return False
        kind = None
        if isinstance(message, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                kind = orjson.loads(message).get("type")
        if kind == "response.create" and model == "busy":
            await conn.send(orjson.dumps(BUSY).decode())
        elif kind == "response.create":
            await self._respond(conn, seen)
        elif kind == "input_audio_buffer.append" and model == "vad":
            await self._vad_turn(conn, seen)
        elif model == "echo":
            await conn.send(message)
        return False

    async def _flood(self, conn: ServerConnection, seen: Seen, count: int, size: int) -> None:
        assert conn.transport is not None
        sock = conn.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 18)
        filler = b"f" * (size - 4)
        for i in range(count):
            seen.blocked = True
            await conn.send(i.to_bytes(4, "big") + filler)
            seen.blocked = False
            seen.sent_at.append(time.perf_counter())

    async def _vad_turn(self, conn: ServerConnection, seen: Seen) -> None:
        """Server VAD: the speaker stops (VAD_PAUSE_S after the audio), the buffer is committed,
        the model answers VAD_PAUSE_S later — with no ``response.create`` from the client."""
        await asyncio.sleep(VAD_PAUSE_S)
        await conn.send(orjson.dumps({"type": "input_audio_buffer.committed"}).decode())
        await asyncio.sleep(VAD_PAUSE_S)
        await self._respond(conn, seen)

    async def _respond(self, conn: ServerConnection, seen: Seen) -> None:
        rid = f"resp_{len(seen.received)}"

        async def send(obj: dict[str, Any]) -> None:
            await conn.send(orjson.dumps(obj).decode())

        await send({"type": "response.created", "response": {"id": rid, "status": "in_progress"}})
        for i in range(self.deltas):
            if i and self.pace_s:
                await asyncio.sleep(self.pace_s)
            seen.sent_at.append(time.perf_counter())
            await send(
                {"type": "response.output_text.delta", "response_id": rid, "delta": f"w{i} "}
            )
        usage = {
            "total_tokens": 15,
            "input_tokens": 10,
            "output_tokens": 5,
            "input_token_details": {"cached_tokens": 4, "text_tokens": 10, "audio_tokens": 0},
            "output_token_details": {"text_tokens": 5, "audio_tokens": 0},
        }
        await send(  # its type not first: the gateway must still find it (and parse it)
            {
                "event_id": f"event_{rid}",
                "type": "response.done",
                "response": {"id": rid, "status": "completed", "output": [], "usage": usage},
            }
        )
