"""The mock as a small model server: a capacity, a queue, vLLM's ``/metrics`` (docs/spec.md §21).

A model server runs a bounded batch: at most ``capacity`` requests generate at once, the others
wait in a queue, first come first served (vLLM's scheduler, without preemption). The mock does
the same with :class:`Capacity`: a model call answered 200 waits for a slot, then takes its
whole answer's time (latency, TTFT, tokens) in that slot, and frees it when its last byte is
sent or its client went away. What it reports is its own state, in vLLM's metric names:

=================================  ===============================================
``vllm:num_requests_running``      requests holding a slot
``vllm:num_requests_waiting``      requests in the queue
``vllm:kv_cache_usage_perc``       running ÷ capacity (0..1, as vLLM reports it)
``vllm:cache_config_info``         its KV cache's settings as labels: ``num_gpu_blocks``
                                   = capacity * :data:`BLOCKS_PER_REQUEST`
=================================  ===============================================

So load builds queues a gateway can see — and route around.

``gateway mock-upstream --capacity N`` serves them at ``GET /metrics``. A ``mock://?capacity=N``
backend is an in-process server named by its whole URL: backends (and gateways of one process)
with the same URL share one queue, as two gateways in front of one model server would; the
gateway reads its ``/metrics`` text in process (:func:`in_process`).

>>> cap = Capacity(2)
>>> cap.try_acquire(), cap.try_acquire(), cap.try_acquire()
(True, True, False)
>>> cap.running, cap.kv_cache_usage
(2, 1.0)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from urllib.parse import parse_qsl, urlsplit

#: what the mock calls its model in ``/metrics`` labels (vLLM names the served model)
METRICS_MODEL = "mock"
#: KV-cache blocks one request takes in the mock (16 tokens a block: a 1 K-token request)
BLOCKS_PER_REQUEST = 64
#: vLLM's block size, in tokens (a label of ``cache_config_info``)
BLOCK_SIZE = 16
_CAPACITY_MAX = 100_000


class Capacity:
    """At most ``limit`` requests running, the others queued in arrival order."""

    __slots__ = ("_waiters", "limit", "running")

    def __init__(self, limit: int) -> None:
        if not 1 <= limit <= _CAPACITY_MAX:
            raise ValueError(f"mock capacity must be in 1..{_CAPACITY_MAX}")
        self.limit = limit
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiters if not f.done())

    @property
    def kv_cache_usage(self) -> float:
        """Running ÷ capacity: each running request holds an equal share of the KV cache."""
        return self.running / self.limit

    def try_acquire(self) -> bool:
        """A slot now, when one is free and nobody waits before us."""
        if self.running < self.limit and not self._waiters:
            self.running += 1
            return True
        return False

    async def acquire(self) -> None:
        """Wait in the queue for a slot (a cancelled wait leaves the queue)."""
        if self.try_acquire():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over as we were cancelled: pass it on
            else:
                waiter.cancel()
                self._drop(waiter)
            raise

    def release(self) -> None:
        """Free a slot: the first request still waiting takes it over."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # ``running`` stays: the slot changes hands
                return
        self.running -= 1

    def _drop(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):  # already handed over and popped
            self._waiters.remove(waiter)

    def metrics(self, model: str = METRICS_MODEL) -> bytes:
        """The server's state in Prometheus text, under vLLM's names (labels as vLLM's V1
        engine sets them).

        >>> print(Capacity(4).metrics().decode().splitlines()[2])
        vllm:num_requests_running{engine="0",model_name="mock"} 0.0
        """
        labels = f'{{engine="0",model_name="{model}"}}'
        gauges = vllm_metrics(labels, self.running, self.waiting, self.kv_cache_usage)
        return gauges + cache_config_info(self.limit * BLOCKS_PER_REQUEST)

    async def admitted(
        self, body: bytes | None, events: AsyncIterator[bytes] | None, delay_s: float
    ) -> AsyncIterator[bytes]:
        """An answer served within a slot: queued, then ``delay_s`` (the answer's latency and
        generation time) and its bytes, the slot freed when the last byte was sent or the
        client went away."""
        await self.acquire()
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            if body is not None:
                yield body
            elif events is not None:
                async for chunk in events:
                    yield chunk
        finally:
            self.release()
            if isinstance(events, AsyncGenerator):  # the engine's streams are generators
                await events.aclose()


def vllm_metrics(labels: str, running: float, waiting: float, kv_usage: float) -> bytes:
    """The three gauges a gateway reads from vLLM, as vLLM's ``/metrics`` writes them."""
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{labels} {float(running)}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{labels} {float(waiting)}\n"
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{labels} {float(kv_usage)}\n"
    ).encode()


def cache_config_info(gpu_blocks: int) -> bytes:
    """vLLM's info gauge of its KV-cache settings (labels as vLLM's ``CacheConfig`` names them):
    ``num_gpu_blocks`` is what a gateway reads, the size of the cache in blocks.

    >>> line = cache_config_info(256).decode().splitlines()[-1]
    >>> line.startswith('vllm:cache_config_info{block_size="16",'), line[-25:]
    (True, 'num_gpu_blocks="256"} 1.0')
    """
    labels = (
        f'block_size="{BLOCK_SIZE}",cache_dtype="auto",enable_prefix_caching="True",'
        f'gpu_memory_utilization="0.9",num_cpu_blocks="0",num_gpu_blocks="{gpu_blocks}"'
    )
    return (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f"vllm:cache_config_info{{{labels}}} 1.0\n"
    ).encode()


#: in-process servers (``mock://…?capacity=N``), by their whole URL
_IN_PROCESS: dict[str, Capacity] = {}


def parse_capacity(raw: str) -> int:
    """A capacity knob's value (``--capacity``, ``mock://?capacity=``), validated."""
    try:
        limit = int(raw)
    except ValueError:
        raise ValueError("mock knob capacity must be an integer") from None
    if not 1 <= limit <= _CAPACITY_MAX:
        raise ValueError(f"mock knob capacity must be in 1..{_CAPACITY_MAX}")
    return limit


def in_process(url: str) -> Capacity | None:
    """The in-process server a ``mock://`` URL names, when it has a capacity (made on first
    use; the same URL is the same server).

    >>> in_process("mock://a?capacity=2") is in_process("mock://a?capacity=2")
    True
    >>> in_process("mock://?ttft_ms=5") is None
    True
    """
    cap = _IN_PROCESS.get(url)
    if cap is not None:
        return cap
    raw = dict(parse_qsl(urlsplit(url).query)).get("capacity")
    if raw is None:
        return None
    cap = _IN_PROCESS[url] = Capacity(parse_capacity(raw))
    return cap


__all__ = [
    "BLOCKS_PER_REQUEST",
    "METRICS_MODEL",
    "Capacity",
    "cache_config_info",
    "in_process",
    "parse_capacity",
    "vllm_metrics",
]
