"""The event loop's lag (docs/spec.md §7, §11; docs/architecture.md, "The Timeline").

A synchronous callback holds the gateway's event loop while an upstream answer waits in its
socket; the lag shows on the request's root span (a real OTLP receiver decodes it) and in
``gateway_event_loop_lag_seconds`` (a real scrape of ``/metrics``). The bounds asserted hold by
construction, on any machine: a loop held for ``BLOCK_S`` runs the monitor's pending reading
(due within ``INTERVAL_S``) at least ``BLOCK_S - INTERVAL_S`` late.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx2
import pytest

from gateway.telemetry.loop_lag import INTERVAL_S, LoopLag
from gateway.telemetry.metrics import FINE_BUCKETS, Histogram
from tests.model_api_support import traced
from tests.otlp_receiver import OTLPReceiver
from tests.spend_support import sample
from tests.support import (
    LAST_CHUNK,
    GatewayServer,
    ScriptedUpstream,
    SeenRequest,
    chat_chunk,
    chunk,
    gateway_config,
    sse_head,
)

BLOCK_S = 0.3
#: what a reading taken after the block must show at least (ms)
AT_LEAST_MS = (BLOCK_S - INTERVAL_S) * 1000


def _routes(upstream_url: str, tracing: str) -> str:
    return f"""
[[backends]]
name = "up"
url = "{upstream_url}"

[[routes]]
name = "all"
models = ["*"]
backends = ["up"]
retries = 0

{tracing}
"""


def _over_100ms(url: str) -> float:
    """Readings of the lag histogram above 0.1 s, as scraped."""
    name = "gateway_event_loop_lag_seconds"
    return sample(url, name + "_count") - sample(url, name + "_bucket", le="0.1")


def test_a_blocked_loop_shows_on_the_root_span_and_in_the_lag_metric():
    gateway: list[GatewayServer] = []

    held = threading.Event()

    def hold() -> None:
        held.set()
        time.sleep(BLOCK_S)

    async def answer(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        monitor = gateway[0].app.runtime.telemetry.loop_lag
        # the gateway's loop runs a 0.3 s synchronous callback; the answer is written while it
        # holds the loop, and waits in the gateway's socket until it is over
        monitor.loop.call_soon_threadsafe(hold)
        await asyncio.to_thread(held.wait, 10)
        writer.write(sse_head() + chunk(chat_chunk("hi")) + chunk(b"data: [DONE]\n\n"))
        writer.write(LAST_CHUNK)
        return True

    upstream = ScriptedUpstream(answer).start()
    with OTLPReceiver("http") as receiver:
        gw = GatewayServer(gateway_config(_routes(upstream.url, traced(receiver.endpoint))))
        gateway.append(gw.start())
        try:
            before = _over_100ms(gw.url)
            with httpx2.stream(
                "POST",
                gw.url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
                timeout=20,
            ) as resp:
                assert resp.status_code == 200
                resp.read()
                trace_id = resp.headers["traceresponse"].split("-")[1]
            spans = receiver.wait_for(
                lambda got: any(s.trace_id == trace_id and s.kind == "SERVER" for s in got)
            )
            deadline = time.monotonic() + 5  # the held-back reading may land after the answer
            while (after := _over_100ms(gw.url)) - before < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            gw.stop()
            upstream.stop()
    (root,) = [s for s in spans if s.trace_id == trace_id and s.kind == "SERVER"]
    assert root.attributes["gateway.event_loop.lag_ms"] >= AT_LEAST_MS
    # the attribution rule (docs/architecture.md, "The Timeline"): the wait for the loop is
    # counted in the interval the late read closes — here the upstream's
    assert root.attributes["gateway.upstream_time_ms"] >= BLOCK_S * 1000
    assert after - before >= 1  # the reading the block held back, in the histogram


def test_a_quiet_request_carries_the_attribute_too():
    async def answer(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(sse_head() + chunk(chat_chunk("hi")) + chunk(b"data: [DONE]\n\n"))
        writer.write(LAST_CHUNK)
        return True

    upstream = ScriptedUpstream(answer).start()
    with OTLPReceiver("http") as receiver:
        gw = GatewayServer(gateway_config(_routes(upstream.url, traced(receiver.endpoint))))
        gw.start()
        try:
            r = httpx2.post(
                gw.url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
                timeout=20,
            )
            trace_id = r.headers["traceresponse"].split("-")[1]
            spans = receiver.wait_for(
                lambda got: any(s.trace_id == trace_id and s.kind == "SERVER" for s in got)
            )
        finally:
            gw.stop()
            upstream.stop()
    (root,) = [s for s in spans if s.trace_id == trace_id and s.kind == "SERVER"]
    assert root.attributes["gateway.event_loop.lag_ms"] >= 0.0


def test_the_monitor_reads_a_held_loop_and_says_nothing_when_stopped():
    histogram = Histogram("h", "", (), FINE_BUCKETS)
    monitor = LoopLag(histogram)
    assert monitor.worst_since(0.0) is None  # not running

    async def main() -> float | None:
        monitor.start()
        start = time.perf_counter()
        time.sleep(BLOCK_S)  # noqa: ASYNC251 -- holds the loop on purpose: the reading runs late
        await asyncio.sleep(INTERVAL_S * 2)  # the late reading runs, then a prompt one
        worst = monitor.worst_since(start)
        monitor.stop()
        return worst

    worst = asyncio.run(main())
    assert worst is not None and worst >= BLOCK_S - INTERVAL_S
    (row,) = histogram.series.values()
    assert row[-1] >= BLOCK_S - INTERVAL_S  # the sum of the readings holds the late one
    assert monitor.worst_since(0.0) is None


@pytest.mark.parametrize("readings", [0, 3, 70])
def test_a_request_reads_only_the_readings_taken_while_it_ran(readings):
    monitor = LoopLag()
    loop = asyncio.new_event_loop()
    try:
        monitor._handle = loop.call_later(3600, lambda: None)  # "running", never due
        monitor._due = time.perf_counter() + 3600
        old = time.perf_counter()
        monitor._at[0], monitor._lags[0], monitor._next = old, 9.0, 1  # before the request
        start = time.perf_counter()
        for i in range(readings):  # then readings of 1 ms, 2 ms, ... (the ring keeps 64)
            slot = monitor._next
            monitor._at[slot], monitor._lags[slot] = time.perf_counter(), (i + 1) / 1000
            monitor._next = (slot + 1) % len(monitor._at)
        worst = monitor.worst_since(start)
    finally:
        monitor.stop()
        loop.close()
    assert worst == pytest.approx(readings / 1000)  # the 9 s one is older than the request
