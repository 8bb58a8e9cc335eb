"""Two mock backends that each hold their own objects (files, batches, conversations, vector
stores, Anthropic batches: gateway/mock/stateful.py), each a real HTTP server on its own
loopback port, and configs balancing one route over both (docs/spec.md §24).

A call the gateway sends to the wrong backend gets that backend's 404, so a misrouted call
fails the test as it would fail a real client.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote_plus

import pytest

from gateway.mock.stateful import MockObjects
from gateway.mock.upstream_app import create_mock_app
from tests.support import ThreadedServer, digest

T = TypeVar("T")

KEY_ONE, KEY_TWO = "sk-tenant-one", "sk-tenant-two"


#: the auth section of a two-tenant config: tenant "t1" (KEY_ONE) and "t2" (KEY_TWO)
TWO_TENANTS = f"""
[auth]
mode = "keys"

[[auth.keys]]
tenant = "t1"
sha256 = "{digest(KEY_ONE)}"

[[auth.keys]]
tenant = "t2"
sha256 = "{digest(KEY_TWO)}"
"""


@dataclass
class Arrived:
    """One request as the backend received it."""

    method: str
    #: the path as sent (escapes kept) and as decoded
    raw_path: str
    path: str
    query: str
    body: bytes

    def text(self) -> str:
        """Everything the backend could read an id from: the path both ways, the query both
        ways, the body as bytes and, when it is JSON, every string in it decoded."""
        parts = [self.raw_path, self.path, self.query, unquote_plus(self.query)]
        parts.append(self.body.decode("utf-8", "replace"))
        try:
            parsed = json.loads(self.body) if self.body else None
        except ValueError:
            parsed = None
        stack = [parsed]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                parts.extend(node)
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
            elif isinstance(node, str):
                parts.append(node)
        return "\n".join(parts)


#: how much of each request body a recording backend keeps
RECORDED_BYTES = 1024 * 1024


class Recording:
    """An ASGI app in front of another that records every HTTP request it is sent."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[Arrived] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        kept = body[:RECORDED_BYTES]  # a big upload's head: ids are in small bodies
        self.seen.append(Arrived(scope["method"], raw, scope["path"], query, kept))
        given = False

        async def again() -> Any:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, again, send)


@dataclass
class MockBackend:
    """A mock backend's server, the objects it holds and every request it received."""

    server: ThreadedServer
    objects: MockObjects
    recording: Recording

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def seen(self) -> list[Arrived]:
        return self.recording.seen


def start_mock() -> MockBackend:
    app = create_mock_app()
    recording = Recording(app)
    return MockBackend(ThreadedServer(recording).start(), app.state.objects, recording)


@pytest.fixture
def mock_pair() -> Iterator[tuple[MockBackend, MockBackend]]:
    """Two mock backends (``gateway mock-upstream``'s app), each with its own state."""
    pair = (start_mock(), start_mock())
    yield pair
    for backend in pair:
        backend.server.stop()


def pair_toml(a_url: str, b_url: str, route_extra: str = "", extra: str = "") -> str:
    """Backends ``a`` and ``b`` (each a mock backend's /v1), weighted 1:1 on one route."""
    return f"""
[[backends]]
name = "a"
url = "{a_url}/v1"

[[backends]]
name = "b"
url = "{b_url}/v1"

[[routes]]
name = "main"
models = ["*"]
backends = ["a", "b"]
strategy = "weighted"
weights = [1, 1]
{route_extra}
{extra}
"""


def batch_jsonl(n: int) -> bytes:
    """A batch input file: ``n`` chat completions."""
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-test", "messages": [{"role": "user", "content": f"hi {i}"}]},
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def upload(name: str, data: bytes) -> tuple[str, io.BytesIO]:
    return (name, io.BytesIO(data))


def until(check: Callable[[], T | None], tries: int = 400) -> T:
    """Poll ``check`` until it returns something (a mock batch completes after 0.3 s)."""
    for _ in range(tries):
        found = check()
        if found is not None:
            return found
        time.sleep(0.025)
    raise AssertionError("never happened")


def done_batch(client: Any, batch_id: str) -> Any:
    def check() -> Any:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status == "completed" else None

    return until(check)


def anthropic_pair_toml(a_url: str, b_url: str, extra: str = "") -> str:
    """Backends ``a`` and ``b`` as ``provider = "anthropic"`` (each a mock backend), weighted
    1:1 on a ``claude-*`` route."""
    return f"""
[[backends]]
name = "a"
url = "{a_url}/v1"
provider = "anthropic"

[[backends]]
name = "b"
url = "{b_url}/v1"
provider = "anthropic"

[[routes]]
name = "claude"
models = ["claude-*"]
backends = ["a", "b"]
strategy = "weighted"
weights = [1, 1]
{extra}
"""


def message_requests(n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"req-{i}",
            "params": {
                "model": "claude-test",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"hi {i}"}],
            },
        }
        for i in range(n)
    ]


def ended_batch(client: Any, batch_id: str) -> Any:
    def check() -> Any:
        batch = client.messages.batches.retrieve(batch_id)
        return batch if batch.processing_status == "ended" else None

    return until(check)


def mixed_toml(a_url: str, b_url: str) -> str:
    """Both mock backends twice: as ``provider = "anthropic"`` on a ``claude-*`` route (first),
    and as OpenAI-compatible on a catch-all route."""
    claude = anthropic_pair_toml(a_url, b_url).replace('name = "a"', 'name = "claude-a"')
    claude = claude.replace('name = "b"', 'name = "claude-b"')
    claude = claude.replace('backends = ["a", "b"]', 'backends = ["claude-a", "claude-b"]')
    return claude + pair_toml(a_url, b_url)
