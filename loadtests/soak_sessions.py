"""The soak's sessions (loadtests/soak.py): besides its chat requests, each client now and then
runs one session of another kind through the same gateway, judged like the rest:

- **realtime** (docs/spec.md §19): a WebSocket to ``/v1/realtime?model=rt-soak`` (the
  ``websockets`` client), ``session.created``, then one to three responses
  (``conversation.item.create`` + ``response.create``) read to their ``response.done``: expected
  when every response completed and its deltas add up to its ``response.output_text.done``;
- **mcp** (docs/spec.md §23): the official ``mcp`` SDK client on ``/mcp`` — ``initialize``,
  ``tools/list``, ``tools/call`` of a tool on the soak's MCP server (a progress notification
  over SSE, then the answer) and of the built-in server's ``echo``, then the session's end
  (``DELETE``): expected when the list is exactly the allowed tools (the denied one absent)
  and each call echoes its text;
- **files** (docs/spec.md §24): the official ``openai`` SDK uploads a random file (multipart,
  16 KiB to 1 MiB) to ``/v1/files``, streams its content back and deletes it: expected when the
  bytes come back unchanged and the delete is confirmed.

Anything else — an exception, an error event, a close code but 1000, altered bytes, no end in
``CLIENT_TIMEOUT_S`` — is **unexpected**, with an example kept. The upstreams: ``gateway
mock-upstream`` (realtime, files) and the official SDK's ``MCPServer`` on uvicorn, which this
module serves itself with ``python loadtests/soak_sessions.py --mcp-server PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import openai
import orjson
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent
from websockets.asyncio.client import connect

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CLIENT_TIMEOUT_S = 30.0
#: the share of a client's turns spent on each kind of session (the rest are chat requests)
SHARES = {"realtime": 0.04, "mcp": 0.04, "files": 0.04}
#: the model of the realtime sessions, and the route (to ``gateway mock-upstream``) serving it
REALTIME_MODEL = "rt-soak"
#: the tools ``/mcp`` lists: the soak server's (``secret`` denied by the config) and the built-in's
MCP_TOOLS = sorted(
    [
        "tools__add",
        "tools__announce",
        "tools__echo",
        "tools__slow",
        "builtin__echo",
        "builtin__time",
    ]
)
FILE_SIZES = (16 * 1024, 1024 * 1024)
#: what each kind's sessions did, as the table names it
STEPS = {"realtime": "responses", "mcp": "tool calls", "files": "bytes up and down"}


def gateway_toml(mock_port: int, mcp_port: int) -> str:
    """What the soak's gateway config adds for its sessions: the mock upstream's backend and
    route (realtime models, every file purpose), and the two MCP servers."""
    return (
        f'[[backends]]\nname = "m"\nurl = "http://127.0.0.1:{mock_port}/v1"\n\n'
        '[[routes]]\nname = "sessions"\nmodels = ["rt-*"]\nbackends = ["m"]\npurposes = ["*"]\n\n'
        f'[[mcp_servers]]\nname = "tools"\nurl = "http://127.0.0.1:{mcp_port}/mcp"\n'
        'tools_deny = ["secret"]\n\n'
        '[[mcp_servers]]\nname = "builtin"\nurl = "mock://"\n\n'
    )


class Unexpected(Exception):
    """A session outcome that is not the expected one."""


@dataclass
class SessionTally:
    #: kind -> sessions that ended as expected
    done: Counter[str] = field(default_factory=Counter)
    #: kind -> what its sessions did (:data:`STEPS`)
    steps: Counter[str] = field(default_factory=Counter)
    #: "kind: what went wrong" -> count
    unexpected: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def bad(self, kind: str, what: str) -> None:
        self.unexpected[f"{kind}: {what}"] += 1
        if len(self.examples) < 10:
            self.examples.append(f"{time.monotonic() - self.started:6.1f} s  {kind}: {what}")

    def rows(self) -> list[str]:
        rows = ["sessions by kind (expected, what they did)"]
        for kind in SHARES:
            rows.append(
                f"  {kind:<10} {self.done[kind]:>8} expected   {self.steps[kind]} {STEPS[kind]}"
            )
        rows.append(f"{'unexpected session outcomes (must be 0)':<66} {self.total:>10}")
        rows += [f"  {k:<64} {v:>10}" for k, v in sorted(self.unexpected.items())]
        rows += [f"  {line}" for line in self.examples]
        return rows

    @property
    def total(self) -> int:
        return sum(self.unexpected.values())


class Sessions:
    """One soak client's sessions (its openai client is made once and reused)."""

    def __init__(self, port: int, tally: SessionTally) -> None:
        self.port = port
        self.tally = tally
        self._files: openai.AsyncOpenAI | None = None

    def pick(self, rng: random.Random) -> str | None:
        """A kind of session for this turn, or None (a chat request)."""
        roll = rng.random()
        for kind, share in SHARES.items():
            if roll < share:
                return kind
            roll -= share
        return None

    async def run(self, kind: str, rng: random.Random) -> None:
        work = {"realtime": self.realtime, "mcp": self.mcp, "files": self.files}[kind]
        try:
            async with asyncio.timeout(CLIENT_TIMEOUT_S):
                await work(rng)
        except Unexpected as exc:
            self.tally.bad(kind, str(exc))
        except TimeoutError:
            self.tally.bad(kind, f"no end in {CLIENT_TIMEOUT_S:g} s")
        except Exception as exc:  # a refusal, a reset, a protocol error: all unexpected here
            self.tally.bad(kind, f"{type(exc).__name__}: {str(exc)[:120]}")
        else:
            self.tally.done[kind] += 1

    async def realtime(self, rng: random.Random) -> None:
        url = f"ws://127.0.0.1:{self.port}/v1/realtime?model={REALTIME_MODEL}"
        async with connect(url, open_timeout=CLIENT_TIMEOUT_S) as ws:
            first = orjson.loads(await ws.recv())
            if first.get("type") != "session.created":
                raise Unexpected(f"first event {first.get('type')!r}, not session.created")
            for n in range(rng.randint(1, 3)):
                text = f"soak turn {n} {rng.getrandbits(32):08x}"
                part = {"type": "input_text", "text": text}
                item = {"type": "message", "role": "user", "content": [part]}
                await ws.send(
                    orjson.dumps({"type": "conversation.item.create", "item": item}).decode()
                )
                await ws.send(orjson.dumps({"type": "response.create"}).decode())
                await _one_response(ws)
                self.tally.steps["realtime"] += 1
        if ws.close_code != 1000:
            raise Unexpected(f"closed with {ws.close_code}, not 1000")

    async def mcp(self, rng: random.Random) -> None:
        url = f"http://127.0.0.1:{self.port}/mcp"
        async with (
            httpx2.AsyncClient(timeout=CLIENT_TIMEOUT_S) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            names = sorted(t.name for t in (await client.list_tools()).tools)
            if names != MCP_TOOLS:
                raise Unexpected(f"tools/list gave {names}")
            for tool in ("tools__echo", "builtin__echo"):
                text = f"soak {rng.getrandbits(48):012x}"
                result = await client.call_tool(tool, {"text": text})
                got = [c.text for c in result.content if isinstance(c, TextContent)]
                if result.is_error or got != [text]:
                    raise Unexpected(f"{tool} answered {got!r} (error: {result.is_error})")
                self.tally.steps["mcp"] += 1

    async def files(self, rng: random.Random) -> None:
        if self._files is None:
            self._files = openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{self.port}/v1",
                api_key="soak",
                max_retries=0,
                timeout=CLIENT_TIMEOUT_S,
            )
        client = self._files
        data = rng.randbytes(rng.randint(*FILE_SIZES))
        made = await client.files.create(file=("soak.bin", data), purpose="user_data")
        digest = hashlib.sha256()
        size = 0
        async with client.files.with_streaming_response.content(made.id) as resp:
            async for piece in resp.iter_bytes():
                digest.update(piece)
                size += len(piece)
        if size != len(data) or digest.digest() != hashlib.sha256(data).digest():
            raise Unexpected(f"read back {size} bytes of {len(data)}, or other bytes")
        deleted = await client.files.delete(made.id)
        if not deleted.deleted:
            raise Unexpected("the delete was not confirmed")
        self.tally.steps["files"] += 2 * len(data)

    async def aclose(self) -> None:
        if self._files is not None:
            await self._files.close()


async def _one_response(ws: Any) -> None:
    """Read one response's events to its ``response.done``: completed, deltas adding up."""
    deltas: list[str] = []
    final: str | None = None
    while True:
        event = orjson.loads(await ws.recv())
        kind = event.get("type")
        if kind == "error":
            raise Unexpected(f"error event: {event.get('error')}")
        if kind == "response.output_text.delta":
            deltas.append(event["delta"])
        elif kind == "response.output_text.done":
            final = event["text"]
        elif kind == "response.done":
            status = event["response"].get("status")
            if status != "completed" or final is None or "".join(deltas) != final:
                raise Unexpected(f"response {status}, deltas {len(deltas)}, text {final!r}")
            return


def serve_mcp(port: int) -> None:
    """The soak's MCP server: the tests' tool server (the official SDK's ``MCPServer``)."""
    import uvicorn

    from tests.mcp.mcp_support import tool_server

    app = tool_server("tools").streamable_http_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the soak's MCP server")
    parser.add_argument("--mcp-server", type=int, required=True, metavar="PORT")
    serve_mcp(parser.parse_args().mcp_server)
