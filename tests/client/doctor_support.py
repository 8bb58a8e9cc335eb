"""Servers and helpers for the probe and doctor tests: an OpenAI-shaped scripted upstream whose
streams are paced, buffered or cut, and the mock backend over TLS + HTTP/2 (hypercorn, trustme).

Everything listens on 127.0.0.1 and is stopped by its own handle.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Literal

import orjson
import trustme
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from gateway.mock.upstream_app import create_mock_app
from tests.support import (
    LAST_CHUNK,
    Handler,
    SeenRequest,
    chat_chunk,
    chunk,
    free_port,
    gateway_cli,
    http_response,
    sse_head,
    wait_port,
)

CHAT_MODEL = "scripted-chat"
EMBEDDING_MODEL = "scripted-embedding"
StreamMode = Literal["paced", "buffered", "no-done"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        gateway_cli(*args),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def doctor_json(
    base_url: str, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``gateway doctor --json``: the process and its parsed report."""
    out = run_cli("doctor", base_url, "--json", *args, env=env)
    assert out.stdout.strip(), f"no JSON on stdout (exit {out.returncode}):\n{out.stderr}"
    assert "Traceback" not in out.stderr, out.stderr
    return out, json.loads(out.stdout)


def checks_by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def openai_upstream(
    stream: StreamMode = "paced",
    *,
    gap_s: float = 0.03,
    wait_s: float = 0.5,
    events: int = 10,
    close: bool = False,
    models_status: int = 200,
    eol: bytes = b"\n",
) -> Handler:
    """An OpenAI-compatible upstream written byte for byte.

    ``stream``: ``paced`` sends one event every ``gap_s``; ``buffered`` waits ``wait_s`` and then
    sends the whole stream in one write (what a buffering proxy delivers); ``no-done`` paces but
    ends without ``data: [DONE]``. ``eol`` ends the stream's lines (LF, CRLF or CR: WHATWG
    allows all three). ``close`` answers ``Connection: close`` and closes every connection.
    Embeddings are a 256-float vector (about 5 KB, never compressed). Paths outside ``/v1``
    answer 404, like the public APIs.
    """
    extra = [("connection", "close")] if close else []

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        path = req.target.split("?", 1)[0]
        if req.method == "GET" and path == "/v1/models":
            if models_status != 200:
                err = {"error": {"message": "no listing here", "type": "not_found_error"}}
                writer.write(http_response(models_status, orjson.dumps(err), extra=extra))
                return not close
            data = [{"id": m, "object": "model"} for m in (CHAT_MODEL, EMBEDDING_MODEL)]
            writer.write(
                http_response(200, orjson.dumps({"object": "list", "data": data}), extra=extra)
            )
            return not close
        body = orjson.loads(req.body or b"{}")
        if path == "/v1/embeddings":
            vector = [round(0.001 * i - 0.1, 6) for i in range(256)]
            answer = {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": vector}],
                "model": body.get("model"),
                "usage": {"prompt_tokens": 3, "total_tokens": 3},
            }
            writer.write(http_response(200, orjson.dumps(answer), extra=extra))
            return not close
        if path != "/v1/chat/completions":
            err = b'{"error": {"message": "unknown path", "type": "invalid_request_error"}}'
            writer.write(http_response(404, err, extra=extra))
            return not close
        if body.get("stream") is not True:
            answer = {
                "id": "chatcmpl-s",
                "object": "chat.completion",
                "created": 1,
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Hello there."},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }
            writer.write(http_response(200, orjson.dumps(answer), extra=extra))
            return not close
        sse = [chat_chunk(f" w{i}") for i in range(events)]
        sse.append(chat_chunk(None, finish="stop"))
        if stream != "no-done":
            sse.append(b"data: [DONE]\n\n")
        pieces = [chunk(event.replace(b"\n", eol)) for event in sse]
        pieces.append(LAST_CHUNK)
        if stream == "buffered":
            await asyncio.sleep(wait_s)
            writer.write(sse_head(extra) + b"".join(pieces))
            return not close
        writer.write(sse_head(extra))
        await writer.drain()
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(gap_s)
            writer.write(piece)
            await writer.drain()
        return not close

    return handler


# ---------------------------------------------------------------- TLS + HTTP/2


class TlsMockServer:
    """The mock backend over https (h2 and http/1.1 by ALPN), certificate from a test CA."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        self.ca_path = tmp / "ca.pem"
        ca.cert_pem.write_to_path(str(self.ca_path))
        self._cert_path = tmp / "server.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(str(self._cert_path))
        self.versions: list[str] = []
        self._app = create_mock_app()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1"

    async def _asgi(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.versions.append(scope["http_version"])
        await self._app(scope, receive, send)

    def _run(self) -> None:
        cfg = HypercornConfig()
        cfg.bind = [f"127.0.0.1:{self.port}"]
        cfg.certfile = str(self._cert_path)
        cfg.keyfile = str(self._cert_path)
        cfg.accesslog = None
        cfg.errorlog = None

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve(self._asgi, cfg, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        asyncio.run(main())

    def start(self) -> TlsMockServer:
        self._thread.start()
        wait_port(self.port)
        deadline = time.monotonic() + 5
        while self._loop is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


# ---------------------------------------------------------------- curl


CURL_FORMAT = (
    '{"dns": %{time_namelookup}, "connect": %{time_connect}, "tls": %{time_appconnect}, '
    '"ttfb": %{time_starttransfer}, "total": %{time_total}}'
)


def curl_marks_ms(url: str, *extra: str) -> dict[str, float]:
    """``curl -w`` marks of one GET, in ms (cumulative from the start, as curl reports them)."""
    out = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "--noproxy", "*", "-w", CURL_FORMAT, *extra, url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {k: v * 1000 for k, v in json.loads(out.stdout).items()}


def median_of(runs: list[dict[str, float]], mark: str) -> float:
    return statistics.median(r[mark] for r in runs)
