"""Real servers on loopback for the tests: the gateway, the mock upstream, scripted upstreams;
and the official SDKs as their clients.

Everything here listens on 127.0.0.1 on a free port and is stopped by its own handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import uvicorn

from gateway.app import Gateway
from gateway.config import Config, load_config
from gateway.server.process import Server, bind
from gateway.server.state import server_state


def digest(key: str) -> str:
    """What ``[[auth.keys]] sha256`` holds for ``key`` (docs/spec.md §12)."""
    return hashlib.sha256(key.encode()).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


# ---------------------------------------------------------------- servers in a thread


class ThreadedServer:
    """An ASGI app served by uvicorn (uvloop + httptools) in a background thread."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            loop="uvloop",
            http="httptools",
            lifespan=kwargs.pop("lifespan", "on"),
            proxy_headers=False,
            server_header=False,
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=2,
            **kwargs,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class GatewayServer:
    """The gateway on the server ``gateway serve`` runs (gateway/server/process.py's
    :class:`Server` and its HTTP/1.1 protocol, gateway/server/http1.py: client timeouts and
    limits, the socket ``received`` stamp, one write per response), in a thread: no signal
    handlers there, and :meth:`stop` is the SIGTERM drain."""

    def __init__(self, config: Config, grace_s: float = 2.0) -> None:
        self.app = Gateway(config)
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = Server(server_state(config, self.app), self.sock, grace_s)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.scheme = "https" if config.server.tls is not None else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)
        self.sock.close()

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


def gateway_config(toml: str, **env: str) -> Config:
    return load_config(text=toml, env=env)


def config_for(
    upstream_url: str, extra: str = "", backend_extra: str = "", route_extra: str = ""
) -> Config:
    """A one-backend, catch-all config pointing at ``upstream_url`` (…/v1)."""
    return gateway_config(
        f"""
[[backends]]
name = "up"
url = "{upstream_url}"
api_key_env = "TEST_BACKEND_KEY"
{backend_extra}

[[routes]]
models = ["*"]
backends = ["up"]
{route_extra}
{extra}
"""
    )


# ---------------------------------------------------------------- subprocesses


class Process:
    """A child process we started; stopped by its own PID (never by name)."""

    def __init__(self, args: list[str], port: int, env: dict[str, str] | None = None) -> None:
        self.port = port
        #: what it printed (stdout and stderr), once stopped
        self.output = ""
        self.proc = subprocess.Popen(
            args,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_port(port, 15)
        except TimeoutError:
            out = self.stop()  # what it printed before it died (or was stopped)
            raise RuntimeError(f"{args} did not start:\n{out}") from None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> str:
        """SIGTERM (then SIGKILL after 10 s); returns what the process printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout and not self.proc.stdout.closed:
            self.output = self.proc.stdout.read().decode(errors="replace")
            self.proc.stdout.close()
        return self.output


def gateway_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


# ---------------------------------------------------------------- scripted upstream


@dataclass
class SeenRequest:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    connection: int
    received_at: float = field(default_factory=time.monotonic)

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def header_names(self) -> set[str]:
        return {k.lower() for k, _ in self.headers}


Handler = Callable[[SeenRequest, asyncio.StreamWriter], Awaitable[bool | None]]


class ScriptedUpstream:
    """A minimal HTTP/1.1 server whose answers are written byte for byte by a test handler.

    It can do what a well-behaved server would not: reset mid-body, lie about lengths, stall,
    send both Content-Length and Transfer-Encoding. The handler gets each parsed request and
    the raw writer; returning False closes the connection, anything else keeps it alive.
    ``requests`` records every request and ``connections`` counts accepted TCP connections.
    """

    #: the listen backlog (asyncio's default; tests that open thousands of connections at
    #: once raise it, or the kernel drops SYNs)
    backlog = 100

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.port = free_port()
        self.requests: list[SeenRequest] = []
        self.connections = 0
        self.closed_connections = 0
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedUpstream:
        self.thread.start()
        if not self._started.wait(5):
            raise RuntimeError("scripted upstream did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, backlog=self.backlog
            )
            self._started.set()
            async with self._server:
                await self._server.serve_forever()

        self._main = self.loop.create_task(main())
        try:
            with contextlib.suppress(asyncio.CancelledError):
                self.loop.run_until_complete(self._main)
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            # let the transports' close callbacks run before the loop goes away
            for _ in range(3):
                self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def stop(self) -> None:
        def _close() -> None:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()

        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(_close)
        self.thread.join(5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            while True:
                req = await read_request(reader, conn)
                if req is None:
                    return
                self.requests.append(req)
                keep = await self.handler(req, writer)
                await writer.drain()
                if keep is False:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            return  # stop(): end quietly (a cancelled handler task would be logged as an error)
        finally:
            self.closed_connections += 1
            with contextlib.suppress(Exception):
                writer.close()


async def read_request(reader: asyncio.StreamReader, conn: int) -> SeenRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = []
    for line in lines[1:]:
        if line:
            k, v = line.split(":", 1)
            headers.append((k.strip(), v.strip()))
    lower = {k.lower(): v for k, v in headers}
    body = b""
    if "content-length" in lower:
        body = await reader.readexactly(int(lower["content-length"]))
    elif lower.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    return SeenRequest(method, target, headers, body, conn)


def http_response(
    status: int,
    body: bytes,
    content_type: str = "application/json",
    extra: list[tuple[str, str]] | None = None,
) -> bytes:
    reason = {
        200: "OK",
        400: "Bad Request",
        429: "Too Many Requests",
        500: "Server Error",
        502: "Bad Gateway",
        503: "Service Unavailable",
    }.get(status, "Status")
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"content-type: {content_type}",
        f"content-length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in extra or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def answering(body: bytes, status: int = 200) -> Handler:
    """An upstream handler that answers every request with one fixed JSON response."""

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(http_response(status, body))
        return True

    return handler


def sse_head(extra: list[tuple[str, str]] | None = None) -> bytes:
    lines = [
        "HTTP/1.1 200 OK",
        "content-type: text/event-stream",
        "cache-control: no-cache",
        "transfer-encoding: chunked",
    ]
    lines += [f"{k}: {v}" for k, v in extra or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def chat_chunk(
    content: str | None, *, finish: str | None = None, ident: str = "chatcmpl-t", model: str = "m"
) -> bytes:
    import orjson

    delta: dict[str, Any] = {} if content is None else {"content": content}
    obj = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


@contextlib.contextmanager
def running(*servers: Any) -> Iterator[None]:
    started = []
    try:
        for s in servers:
            s.start()
            started.append(s)
        yield
    finally:
        for s in reversed(started):
            s.stop()


#: the chat stream :func:`paced_upstream` sends, one word per event
WORDS = ["Streams", " arrive", " one", " event", " at", " a", " time", "."]
GAP_S = 0.3


def paced_upstream(sent_at: list[float], gap: float = GAP_S) -> Handler:
    """An upstream that sends one chat chunk every ``gap`` seconds, recording when each left.

    Each time is taken just before the write: no byte of that event left earlier, so "event i
    arrived before ``sent_at[i + 1]``" proves it arrived before event i+1 was sent — and the
    time is on record before the client can have the event (stamping after the write raced a
    client that finished reading first)."""

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head())
        await writer.drain()
        for i, word in enumerate(WORDS):
            if i:
                await asyncio.sleep(gap)
            sent_at.append(time.monotonic())
            writer.write(chunk(chat_chunk(word)))
            await writer.drain()
        await asyncio.sleep(gap)
        sent_at.append(time.monotonic())
        writer.write(chunk(chat_chunk(None, finish="stop")) + chunk(b"data: [DONE]\n\n"))
        writer.write(LAST_CHUNK)
        await writer.drain()
        return True

    return handler


# ---------------------------------------------------------------- the SDKs as clients


def openai_client(base_url: str, api_key: str = "k", **kwargs: Any) -> openai.OpenAI:
    """The official ``openai`` SDK pointed at ``base_url`` (``…/v1``) as an application points
    it, its own retries off unless asked (``max_retries``): a retry would hide the answer under
    test. conftest's ``_close_sync_sdk_clients`` closes it at the test's end."""
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=base_url, api_key=api_key, **kwargs)


def async_openai_client(base_url: str, api_key: str = "k", **kwargs: Any) -> openai.AsyncOpenAI:
    """:func:`openai_client`'s async twin; the test closes it inside its own loop."""
    kwargs.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, **kwargs)


def anthropic_client(base_url: str, api_key: str = "k", **kwargs: Any) -> anthropic.Anthropic:
    """The official ``anthropic`` SDK; ``base_url`` is the root (the SDK appends
    ``/v1/messages``). Retries off and closed at the test's end, as :func:`openai_client`."""
    kwargs.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=base_url, api_key=api_key, **kwargs)


# ---------------------------------------------------------------- waiting for a peer


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Wait (at most 5 s) for something a peer sees, e.g. a connection's EOF."""
    deadline = time.monotonic() + 5
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within 5 s: {what}")
        await asyncio.sleep(0.01)
