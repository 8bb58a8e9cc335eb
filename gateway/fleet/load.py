"""Model-server load: one scraper per backend, off the request path (docs/spec.md §21).

A backend with a ``metrics_url`` (vLLM, SGLang, ``gateway mock-upstream --capacity N``) — or a
``mock://…?capacity=N`` backend, whose server lives in this process — gets one task, started
with the runtime and stopped with it, that every ``metrics_interval_ms`` reads the server's
Prometheus text and publishes one immutable :class:`Load` into the backend's health
(:meth:`gateway.fleet.health.Health.publish`): the one place the strategies read. The request
path reads the latest snapshot and never awaits a scrape (docs/architecture.md, "Background work
never sits on the request path").

What is read (prometheus-client's text parser; the text is first cut down to the sample lines of
these names, so a vLLM ``/metrics`` of hundreds of histogram lines costs the parser a handful):

=============  ===================================  ======================================
queue depth    ``vllm:num_requests_waiting``        ``sglang:num_queue_reqs``
running        ``vllm:num_requests_running``        ``sglang:num_running_reqs``
KV-cache use   ``vllm:kv_cache_usage_perc``, else   ``sglang:token_usage``
               ``vllm:gpu_cache_usage_perc``
size           ``vllm:cache_config_info``'s         ``sglang:max_running_requests``
               ``num_gpu_blocks`` label (blocks)    (requests it runs at once)
=============  ===================================  ======================================

Queue depth and running are summed over label sets (engines, data-parallel ranks); KV-cache
usage, a ratio, is the fullest label set's (the engine that fills first is the one that stalls).
The size, where the server states it, is what the scorer (:class:`gateway.fleet.scorer.Scorer`)
learns a backend's capacity from beside its scrapes.
A scrape that fails — an error answer, text without these names, no answer within the period
(the timeout) — publishes nothing known: the backend's load is unknown at once (and so is a
snapshot older than three periods, should the scraper itself fall behind). Unknown load never
fails a request: the backend is then scored by this gateway's own in-flight requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gateway.config import BackendConfig
from gateway.errors import GatewayError
from gateway.mock.capacity import in_process
from gateway.routes import Backend
from gateway.transports.http1_client import Http1ClientTransport

log = logging.getLogger("gateway")

#: metric names per quantity, in order of preference (the first present is used)
QUEUE = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
#: what the server says of its size: the most requests it runs at once, its KV-cache blocks
CAPACITY = ("sglang:max_running_requests",)
CACHE_CONFIG = "vllm:cache_config_info"
_NAMES = (*QUEUE, *RUNNING, *KV_CACHE, *CAPACITY, CACHE_CONFIG)
#: known load turns unknown this many scrape periods after it was read
STALE_PERIODS = 3
#: a metrics answer larger than this is refused (a model server's is tens of KiB)
MAX_METRICS_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Load:
    """What one scrape of a model server said; immutable, replaced whole by the next."""

    #: requests waiting in the server's queue
    queue: float
    #: requests it is running (None: it did not say)
    running: float | None
    #: KV-cache usage, 0..1 (None: it did not say)
    kv_cache: float | None
    #: queue ≥ max_queue or KV-cache ≥ max_kv_cache
    saturated: bool
    #: monotonic time it was read
    at: float
    #: monotonic time from which it is too old to count (``at`` + three periods)
    until: float
    #: the most requests it runs at once, where it says so (SGLang's max_running_requests)
    capacity: float | None = None
    #: its KV cache's size in blocks, where it says so (vLLM's cache_config_info)
    blocks: float | None = None


class MetricsError(Exception):
    """A scrape that gave nothing to go by."""


def read_load(text: str) -> tuple[float, float | None, float | None]:
    """Queue depth, running and KV-cache usage from a model server's Prometheus text.

    >>> read_load('''
    ... vllm:num_requests_waiting{engine="0"} 3
    ... vllm:num_requests_waiting{engine="1"} 1
    ... vllm:kv_cache_usage_perc{engine="0"} 0.5
    ... vllm:kv_cache_usage_perc{engine="1"} 0.25
    ... ''')
    (4.0, None, 0.5)
    >>> read_load("sglang:num_queue_reqs 2\\nsglang:num_running_reqs 8\\nsglang:token_usage 0.7\\n")
    (2.0, 8.0, 0.7)
    """
    return read_metrics(text)[:3]


def read_metrics(
    text: str,
) -> tuple[float, float | None, float | None, float | None, float | None]:
    """:func:`read_load`'s three, then what the server says of its size: the most requests it
    runs at once (SGLang's ``max_running_requests``, summed) and its KV-cache blocks (the
    ``num_gpu_blocks`` label of vLLM's ``cache_config_info``, the largest engine's).

    >>> read_metrics('''vllm:num_requests_waiting 0
    ... vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1.0
    ... ''')
    (0.0, None, None, None, 2048.0)
    """
    sums: dict[str, float] = {}
    peaks: dict[str, float] = {}
    blocks: float | None = None
    try:
        for family in text_string_to_metric_families(_samples_of(text)):
            for sample in family.samples:
                if sample.name == CACHE_CONFIG:
                    raw = sample.labels.get("num_gpu_blocks", "")
                    if raw.isdigit():
                        blocks = max(blocks or 0.0, float(raw)) or None
                elif sample.name in _NAMES:
                    value = float(sample.value)
                    sums[sample.name] = sums.get(sample.name, 0.0) + value
                    peaks[sample.name] = max(peaks.get(sample.name, value), value)
    except ValueError as exc:
        raise MetricsError(f"unreadable metrics: {exc}") from None
    queue = next((sums[n] for n in QUEUE if n in sums), None)
    if queue is None:
        raise MetricsError("no queue depth (vllm:num_requests_waiting, sglang:num_queue_reqs)")
    running = next((sums[n] for n in RUNNING if n in sums), None)
    kv_cache = next((peaks[n] for n in KV_CACHE if n in peaks), None)
    capacity = next((sums[n] for n in CAPACITY if sums.get(n)), None)
    return queue, running, kv_cache, capacity, blocks


def _samples_of(text: str) -> str:
    """The sample lines of the metrics we read, found by name (``str.find``, C speed): the
    parser then reads a handful of lines, not the hundreds of a vLLM ``/metrics``' histograms.
    Their ``# TYPE`` lines are left out: untyped samples parse alike."""
    text = "\n" + text
    lines: list[str] = []
    for name in _NAMES:
        needle = "\n" + name
        at = text.find(needle)
        while at != -1:
            after = at + len(needle)
            end = text.find("\n", after)
            if end == -1:
                end = len(text)
            if text[after : after + 1] in ("{", " ", "\t"):  # this name, not a longer one
                lines.append(text[at + 1 : end])
            at = text.find(needle, end)
    return "\n".join(lines) + "\n"


def has_load_source(backend: Backend) -> bool:
    """Whether the backend's load can be read: a ``metrics_url``, or an in-process mock with
    a capacity."""
    cfg = backend.config
    return cfg.metrics_url is not None or (cfg.is_mock and in_process(cfg.url) is not None)


#: how a scraper hands its snapshot over (None: the load is unknown)
Publish = Callable[[Backend, Load | None], None]


class Scraper:
    """One backend's scraper: a task that reads its load every period."""

    def __init__(
        self, backend: Backend, publish: Publish, clock: Callable[[], float] = time.monotonic
    ) -> None:
        cfg = backend.config
        self.backend = backend
        self.period = cfg.metrics_interval_ms / 1000
        self._max_queue = cfg.max_queue
        self._max_kv = cfg.max_kv_cache
        self._publish = publish
        self._clock = clock
        self._transport: Http1ClientTransport | None = None
        self._url = cfg.metrics_url
        if self._url is not None:
            # one keep-alive connection; the scrape's whole timeout is the period
            self._transport = Http1ClientTransport(
                BackendConfig(
                    name=f"{cfg.name} metrics",
                    url=self._url,
                    connect_timeout_s=self.period,
                    read_timeout_s=self.period,
                    max_connections=1,
                    idle_timeout_s=max(30.0, 4 * self.period),
                )
            )
        self._capacity = in_process(cfg.url) if cfg.is_mock and self._url is None else None
        #: scrapes that failed in a row (0: the last one worked)
        self.failures = 0

    async def fetch(self) -> str:
        """The server's metrics text (raises :class:`MetricsError` or a gateway error)."""
        if self._capacity is not None:
            return self._capacity.metrics().decode()
        assert self._transport is not None and self._url is not None
        resp = await self._transport.request("GET", self._url, [("accept", "text/plain")], None)
        try:
            if resp.status != 200:
                raise MetricsError(f"{self._url} answered {resp.status}")
            chunks: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_raw():
                size += len(chunk)
                if size > MAX_METRICS_BYTES:
                    raise MetricsError(f"{self._url} sent more than {MAX_METRICS_BYTES} bytes")
                chunks.append(chunk)
        finally:
            await resp.aclose()
        return b"".join(chunks).decode("utf-8", "replace")

    async def scrape(self) -> Load:
        """One scrape, bounded by the period."""
        async with asyncio.timeout(self.period):
            text = await self.fetch()
        queue, running, kv_cache, capacity, blocks = read_metrics(text)
        now = self._clock()
        saturated = queue >= self._max_queue or (kv_cache is not None and kv_cache >= self._max_kv)
        until = now + STALE_PERIODS * self.period
        return Load(queue, running, kv_cache, saturated, now, until, capacity, blocks)

    async def run(self) -> None:
        """Scrape every period until cancelled; a failure makes the load unknown, nothing
        more."""
        name = self.backend.name
        while True:
            started = self._clock()
            try:
                load: Load | None = await self.scrape()
            except Exception as exc:  # whatever it was, the load is unknown; the task goes on
                load = None
                if not self.failures:
                    why = _why(exc)
                    log.warning(
                        "backend %s: load unknown, its metrics scrape failed: %s", name, why
                    )
                self.failures += 1
            else:
                if self.failures:
                    log.info("backend %s: metrics scraped again", name)
                self.failures = 0
            self._publish(self.backend, load)
            await asyncio.sleep(max(0.0, started + self.period - self._clock()))

    async def aclose(self) -> None:
        if self._transport is not None:
            await self._transport.aclose()


def _why(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer within the scrape period"
    if isinstance(exc, MetricsError | GatewayError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class Fleet:
    """The scrapers of one runtime: started in its ``start()``, stopped in its ``aclose()``."""

    def __init__(self, backends: Iterable[Backend], publish: Publish) -> None:
        self.scrapers = tuple(Scraper(b, publish) for b in backends if has_load_source(b))
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(s.run(), name=f"scrape {s.backend.name}") for s in self.scrapers
        ]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await asyncio.gather(*(s.aclose() for s in self.scrapers), return_exceptions=True)


__all__ = [
    "KV_CACHE",
    "QUEUE",
    "RUNNING",
    "STALE_PERIODS",
    "Fleet",
    "Load",
    "MetricsError",
    "Scraper",
    "has_load_source",
    "read_load",
    "read_metrics",
]
