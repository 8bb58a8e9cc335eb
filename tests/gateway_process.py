"""The gateway as its own process (``python -m gateway.cli serve -c FILE``), what the kernel says
about it (RSS, open file descriptors), and a small raw HTTP/1.1 client for many concurrent
connections — what the reliability, drain, slow-client and memory tests share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from tests.support import Process, free_port, gateway_cli

#: enough for the tests that hold thousands of sockets (gateway children inherit it)
WANTED_FDS = 32768


def raise_fd_limit(wanted: int = WANTED_FDS) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards ``wanted`` (never above the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def backend_toml(name: str, url: str, extra: str = "") -> str:
    return f'[[backends]]\nname = "{name}"\nurl = "{url}"\n{extra}\n'


@contextlib.contextmanager
def gateway_process(
    tmp_path: Path, body: str, workers: int = 1, server_extra: str = ""
) -> Iterator[Process]:
    """Write a config (``[server]`` with a free port, quiet logs, then ``body``) and serve it."""
    port = free_port()
    config = tmp_path / f"gateway-{port}.toml"
    config.write_text(
        f"[server]\nport = {port}\nworkers = {workers}\n{server_extra}\n"
        '[logging]\naccess_log = "off"\nlevel = "warning"\n\n' + body
    )
    proc = Process(gateway_cli("serve", "-c", str(config)), port)
    try:
        yield proc
    finally:
        proc.stop()


def rss_kb(pid: int) -> int:
    """VmRSS of a process, in KiB (``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---------------------------------------------------------------- a raw HTTP/1.1 client


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def chat_request(port: int, stream: bool, headers: dict[str, str] | None = None) -> bytes:
    payload: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        payload["stream"] = True
    body = orjson.dumps(payload)
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"host: 127.0.0.1:{port}",
        "content-type: application/json",
        f"content-length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """A response head's status and headers (names lower-cased; a repeated name: the last)."""
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return int(status_line.split(" ", 2)[1]), headers


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 response: Content-Length, chunked, or until the connection closes."""
    status, headers = parse_head(await reader.readuntil(b"\r\n\r\n"))
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    else:
        body = await reader.read()
    return Answer(status, headers, body)


async def ask(port: int, request: bytes) -> Answer:
    """One request on a new connection (closed after)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await read_answer(reader)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def sse_content(body: bytes) -> tuple[str, bool]:
    """The chat stream's joined content, and whether it ended with ``data: [DONE]``."""
    text = []
    done = False
    for event in body.split(b"\n\n"):
        if event.startswith(b"data: [DONE]"):
            done = True
        elif event.startswith(b"data: {"):
            obj = orjson.loads(event[6:])
            for choice in obj.get("choices", ()):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text), done
