"""Simulated model servers on loopback for the fleet tests (docs/spec.md §21).

A :class:`ModelServer` is the mock engine as a small model server — a capacity and a real queue
(:class:`gateway.mock.capacity.Capacity`) — behind uvicorn on a free port, whose ``/metrics`` a
test controls: its own live state in vLLM's names (``live``), values the test forces, in vLLM's
or SGLang's names (``force``), an error answer (``fail``), an answer that never comes
(``hang``), or text without any load metric (``garbage``). It records which model calls it
served (their body and headers), so a test can tell where each request went.

    with ModelServer("a", capacity=2) as a, ModelServer("b", capacity=2) as b:
        a.force(queue=4, kv=0.5)
        ...
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.mock.capacity import Capacity, vllm_metrics
from gateway.mock.engine import MockSettings
from gateway.mock.upstream_app import METRICS_TYPE, create_mock_app
from gateway.types import Receive, Scope, Send
from tests.support import ThreadedServer

MetricsMode = Literal["live", "force", "fail", "hang", "garbage"]


@dataclass
class Served:
    """A model call the server answered (or began to)."""

    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def session(self) -> str | None:
        b = self.body
        meta = b.get("metadata") if isinstance(b.get("metadata"), dict) else {}
        return (
            b.get("prompt_cache_key")
            or meta.get("user_id")
            or b.get("user")
            or self.headers.get("x-session-id")
        )


def sglang_metrics(queue: float, running: float, kv: float) -> bytes:
    labels = '{model_name="mock",tp_rank="0"}'
    return (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        f"sglang:num_running_reqs{labels} {running}\n"
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n"
        "# TYPE sglang:num_queue_reqs gauge\n"
        f"sglang:num_queue_reqs{labels} {queue}\n"
        "# HELP sglang:token_usage The token usage.\n"
        "# TYPE sglang:token_usage gauge\n"
        f"sglang:token_usage{labels} {kv}\n"
    ).encode()


class ModelServer:
    """The mock as a model server with a capacity, over a real socket (see the module doc)."""

    def __init__(self, name: str, capacity: int = 2, latency_ms: float = 0.0, **knobs: Any) -> None:
        self.name = name
        self.capacity = Capacity(capacity)
        settings = MockSettings(latency_ms=latency_ms, capacity=self.capacity, **knobs)
        self._app = create_mock_app(settings)
        self.mode: MetricsMode = "live"
        self.format: Literal["vllm", "sglang"] = "vllm"
        self._forced = (0.0, 0.0, 0.0)
        self.served: list[Served] = []
        self.scrapes = 0
        self._lock = threading.Lock()
        self._server = ThreadedServer(self, lifespan="off")

    # ------------------------------------------------------------ control

    def force(
        self,
        queue: float = 0.0,
        running: float = 0.0,
        kv: float = 0.0,
        fmt: Literal["vllm", "sglang"] = "vllm",
    ) -> None:
        """``/metrics`` reports these values (whatever the server's own state)."""
        self._forced = (float(queue), float(running), float(kv))
        self.format = fmt
        self.mode = "force"

    def count(self) -> int:
        with self._lock:
            return len(self.served)

    def sessions(self) -> list[str | None]:
        with self._lock:
            return [s.session for s in self.served]

    def clear(self) -> None:
        with self._lock:
            self.served.clear()

    # ------------------------------------------------------------ life

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    def backend_toml(self, extra: str = "", interval_ms: int = 50) -> str:
        return (
            f'[[backends]]\nname = "{self.name}"\nurl = "{self.url}/v1"\n'
            f'metrics_url = "{self.url}/metrics"\nmetrics_interval_ms = {interval_ms}\n'
            f"connect_timeout_s = 2\n{extra}\n"
        )

    def start(self) -> ModelServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self.mode = "live"  # a hanging /metrics returns, so the server can stop
        self._server.stop()

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            await self._metrics(send)
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            receive = await self._record(scope, receive)
        await self._app(scope, receive, send)

    async def _record(self, scope: Scope, receive: Receive) -> Receive:
        """Read the body, note the call, hand the app the same body again."""
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = {}
        with self._lock:
            self.served.append(Served(parsed if isinstance(parsed, dict) else {}, headers))
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    async def _metrics(self, send: Send) -> None:
        self.scrapes += 1
        mode = self.mode
        # the test thread flips ``mode``: polled, as no event of this loop can be set from there
        while mode == "hang" and self.mode == "hang":  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        if mode == "hang":  # no longer hanging: answer as the server does now
            mode = self.mode
        if mode == "fail":
            await _answer(send, 500, b"internal error\n")
        elif mode == "garbage":
            await _answer(send, 200, b"# nothing a gateway can read\nprocess_cpu_seconds 1.0\n")
        elif mode == "force":
            queue, running, kv = self._forced
            if self.format == "sglang":
                await _answer(send, 200, sglang_metrics(queue, running, kv))
            else:
                labels = '{engine="0",model_name="mock"}'
                await _answer(send, 200, vllm_metrics(labels, running, queue, kv))
        else:
            await _answer(send, 200, self.capacity.metrics())


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", METRICS_TYPE.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------- the gateway's side


def gauges(base: str) -> dict[tuple[str, str], float]:
    """The gateway's per-backend gauges: (name, backend) -> value."""
    with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, s.labels["backend"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("gateway_backend_")
        for s in family.samples
    }


def wait_until(
    check: Callable[[], bool], timeout: float = 10.0, what: str = "the condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(0.02)


def sees(base: str, want: Iterable[tuple[str, str, float]], timeout: float = 10.0) -> None:
    """Wait until the gateway's gauges show every (name, backend, value) in ``want``."""
    wanted = list(want)

    def check() -> bool:
        got = gauges(base)
        return all(got.get((f"gateway_backend_{n}", b)) == v for n, b, v in wanted)

    wait_until(check, timeout, f"the gateway seeing {wanted}")


def unknown(base: str, backend: str, timeout: float = 10.0) -> None:
    """Wait until the gateway no longer knows ``backend``'s load."""
    wait_until(
        lambda: ("gateway_backend_queue_depth", backend) not in gauges(base),
        timeout,
        f"{backend}'s load turning unknown",
    )


__all__ = ["ModelServer", "Served", "gauges", "sees", "sglang_metrics", "unknown", "wait_until"]
