"""The load scorer (docs/spec.md §21): each backend's load *now*, as ``least_loaded``
(:class:`gateway.fleet.balance.LeastLoaded`) and saturation read it.

The scorer (:class:`Scorer`) estimates each backend's load *now*, not as last scraped
(:func:`estimate`): what it held at the scrape (running + queued) plus what was sent it since
(net of what finished), run up to its capacity, the rest queued, each running request taking
its KV-cache share. What a backend's scrapes teach is kept per process: one request's KV-cache
share (KV usage ÷ running), its capacity (the least of: what the server states —
SGLang's ``max_running_requests``; what its KV cache holds — 1 ÷ the share, or vLLM's
``num_gpu_blocks`` ÷ the blocks one request took on the others; what it ran while others
waited), and how many of the requests it held were this gateway's. The estimate is per process,
so with two gateway replicas each request sent from here counts as the server's requests ÷ this
gateway's (at most :data:`MAX_FLEET_FACTOR`): each replica leaves room for the others. So
between two scrapes a burst onto an idle fleet fills each backend by its room, instead of
herding onto the one that looked emptiest, and saturation is judged on the estimate. A backend
whose load is unknown is scored by this gateway's in-flight requests alone (as the queue, the
KV cache taken as full), so a fleet without metrics is balanced as by ``least_outstanding``.

The scrapers (gateway/fleet/load.py) publish into it, off the request path; the route plans
(gateway/fleet/health.py) read :meth:`Scorer.score` and :meth:`Scorer.saturated`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from gateway.fleet.balance import Outstanding
from gateway.fleet.load import Load, has_load_source
from gateway.routes import Backend

#: each scrape's weight in what is learned of a backend (an exponential moving average)
LEARN = 0.3
#: the most requests one sent by this gateway is counted as (it leaves room for the others)
MAX_FLEET_FACTOR = 4.0


class Estimate(NamedTuple):
    """A backend's load now, as estimated from its last scrape and what was sent since."""

    #: requests waiting in its queue
    queue: float
    #: KV-cache usage, 0..1 (None: the server does not say)
    kv: float | None
    #: (requests it holds + 1) ÷ its capacity: at most 1, the next request runs at once
    #: (None: its capacity is not known yet)
    fill: float | None


def estimate(
    load: Load,
    sent: float,
    share: float | None,
    capacity: float | None,
    in_flight: float = 0.0,
) -> Estimate:
    """A backend's load now, from its last scrape and the requests ``sent`` it since (net of
    those that finished; negative when more finished), given what its past scrapes taught: the
    KV-cache ``share`` one request takes and its ``capacity`` (requests it runs at once).

    What it holds (running + queued, plus ``sent``; never less than this gateway's own
    ``in_flight`` there) runs up to its capacity; the rest waits. The floor matters when a
    request ended at the server just before the scrape and here just after: the scrape no
    longer counts it, its end here counts again — and the slot would be handed out twice.
    Each running request takes its share of the KV cache. Without a known capacity, a server
    that was queueing queues what is sent, and one that was not keeps its KV usage (this
    gateway's in-flight requests break the tie).

    >>> estimate(Load(0, 0, 0.0, False, 0, 1), 1, 1.0, 1.0)   # an idle one-slot server, one sent
    Estimate(queue=0.0, kv=1.0, fill=2.0)
    >>> estimate(Load(0, 2, 0.5, False, 0, 1), 3, 0.25, 4.0)  # 2 of 4 running, 3 sent
    Estimate(queue=1.0, kv=1.0, fill=1.5)
    >>> estimate(Load(3.0, 8.0, 0.9, False, 0, 1), 2, None, None)
    Estimate(queue=5.0, kv=0.9, fill=None)
    >>> estimate(Load(0.0, 1.0, 0.4, False, 0, 1), 5, None, None)  # size unknown: kv stays
    Estimate(queue=0.0, kv=0.4, fill=None)
    >>> estimate(Load(0.0, 2.0, 0.5, False, 0, 1), 1, None, 8.0)  # a stated size, no share yet
    Estimate(queue=0.0, kv=0.75, fill=0.5)
    >>> estimate(Load(0.0, 2.0, None, False, 0, 1), -2, None, 8.0, in_flight=1)
    Estimate(queue=0.0, kv=None, fill=0.25)
    """
    queue, kv = load.queue, load.kv_cache
    running = load.running if load.running is not None else 0.0
    if capacity is None:
        if queue > 0 or kv is None:  # queueing (or no KV-cache figure): what is sent waits
            return Estimate(max(0.0, queue + sent), kv, None)
        return Estimate(0.0, kv, None)
    held = max(0.0, in_flight, running + queue + sent)
    runs = min(held, capacity)
    if kv is not None:
        if share is not None:
            kv = kv + (runs - min(running, capacity)) * share
        elif running:
            kv = kv * runs / running
        kv = min(1.0, max(0.0, kv))
    return Estimate(max(0.0, held - capacity), kv, (held + 1) / capacity)


class Known:
    """What this process knows of one backend's load: the last scrape (``load``), this
    gateway's in-flight requests when it was published (``base``), and what past scrapes
    taught — the KV-cache share of one request, the capacity it showed, and how many of the
    requests it held were this gateway's."""

    __slots__ = (
        "base",
        "blocks",
        "capacity",
        "load",
        "max_kv",
        "max_queue",
        "memo",
        "mine",
        "queued_at",
        "scraped_at",
        "seen",
        "share",
        "size",
        "watched",
    )

    def __init__(self, backend: Backend) -> None:
        #: whether its model server's load is read
        self.watched = has_load_source(backend)
        self.max_queue = backend.config.max_queue
        self.max_kv = backend.config.max_kv_cache
        self.load: Load | None = None
        self.base = 0
        #: when a scrape last worked (monotonic; None: never)
        self.scraped_at: float | None = None
        #: KV-cache share of one running request (None: never seen running)
        self.share: float | None = None
        #: what the server says: the most requests it runs, its KV-cache blocks
        self.capacity: float | None = None
        self.blocks: float | None = None
        #: requests running while others waited (its capacity, as shown)
        self.queued_at: float | None = None
        #: (one request's KV-cache share, capacity), worked out by :class:`Scorer` per scrape
        self.size: tuple[float | None, float | None] = (None, None)
        #: the last estimate and this gateway's in-flight requests it was made with
        self.memo: tuple[int, Estimate] | None = None
        #: requests it held, and of them this gateway's, at the scrapes (averages)
        self.seen: float | None = None
        self.mine: float | None = None

    def learn(self, load: Load, mine: int) -> None:
        running = load.running
        if running and load.kv_cache is not None:
            self.share = _average(self.share, load.kv_cache / running)
        if running and load.queue > 0:
            self.queued_at = _average(self.queued_at, running)
        self.capacity = load.capacity
        self.blocks = load.blocks
        self.seen = _average(self.seen, load.queue + (running or 0.0))
        self.mine = _average(self.mine, mine)

    def fleet_factor(self) -> float:
        """How many requests reach the server for each one this gateway sends it: the other
        gateway replicas' and other clients' beside this one's, as the scrapes showed."""
        seen, mine = self.seen, self.mine
        if seen is None or mine is None or mine < 0.5:
            return 1.0  # too few of its requests were this gateway's to tell
        return min(MAX_FLEET_FACTOR, max(1.0, seen / mine))


def _average(old: float | None, sample: float) -> float:
    return sample if old is None else old + LEARN * (sample - old)


class Scorer:
    """The backends' load as the strategies and saturation read it (docs/spec.md §21): the
    scrapers publish, the route plans read :meth:`score` and :meth:`saturated` — never a
    scrape."""

    def __init__(
        self,
        backends: Iterable[Backend],
        outstanding: Outstanding,
        clock: Callable[[], float],
    ) -> None:
        self._known = {b: Known(b) for b in backends}
        self._outstanding = outstanding
        self._clock = clock
        #: KV-cache blocks one request takes, learned over every backend that says its size
        self._blocks_per_request: float | None = None

    def publish(self, backend: Backend, load: Load | None) -> None:
        """A scraper's latest snapshot (None: the scrape failed, the load is unknown)."""
        known = self._known[backend]
        known.load = load
        mine = known.base = self._outstanding(backend)
        if load is None:
            return
        known.scraped_at = load.at
        known.learn(load, mine)
        if known.share is not None and known.blocks:
            sample = known.share * known.blocks
            self._blocks_per_request = _average(self._blocks_per_request, sample)
        # what the request path reads, worked out here once a scrape (for every backend: the
        # blocks per request learned here may size the others)
        for b, k in self._known.items():
            k.size = (self.share(b), self.capacity(b))
            k.memo = None

    def load(self, backend: Backend, now: float) -> Load | None:
        """The last scrape's load while it is fresh (None: unknown)."""
        load = self._known[backend].load
        return load if load is not None and now < load.until else None

    def capacity(self, backend: Backend) -> float | None:
        """The requests it runs at once, as far as known: what the server says, what its KV
        cache holds (one request's share, learned, or its blocks ÷ the blocks per request
        learned on the others), the most it ran while others waited — the least of these."""
        known = self._known[backend]
        found = [c for c in (known.capacity, known.queued_at) if c]
        share = self.share(backend)
        if share:
            found.append(1 / share)
        return max(1.0, min(found)) if found else None

    def share(self, backend: Backend) -> float | None:
        known = self._known[backend]
        if known.share is not None:
            return known.share
        per_request = self._blocks_per_request
        return per_request / known.blocks if per_request and known.blocks else None

    def estimate(self, backend: Backend, now: float) -> Estimate | None:
        """Its load now (None: unknown): the last scrape moved by what this gateway sent it
        since, net of what ended — more sent than ended is counted :meth:`Known.fleet_factor`
        times (the other replicas send too); more ended frees that many slots, no more (the
        others' ends are not seen, and a server with a queue hands a freed slot to it)."""
        known = self._known[backend]
        load = known.load
        if load is None or now >= load.until:
            return None
        out = self._outstanding(backend)
        memo = known.memo
        if memo is not None and memo[0] == out:
            return memo[1]  # nothing sent or ended since it was worked out (nor scraped)
        sent: float = out - known.base
        if sent > 0:  # others send too; what ended here freed one slot each, no more
            sent *= known.fleet_factor()
        est = estimate(load, sent, *known.size, out)
        known.memo = (out, est)
        return est

    def score(self, backend: Backend) -> tuple[float, float, float, int]:
        """``least_loaded``'s view of a backend: the wait a request sent now would have, in
        answers' times (requests beyond its capacity ÷ capacity; the queue depth while the
        capacity is unknown), then how full it would be (its fill, else the KV-cache usage),
        then the KV-cache usage, then this gateway's in-flight requests. Unknown load is scored
        by the in-flight requests alone (as the queue, the KV cache taken as full)."""
        out = self._outstanding(backend)
        est = self.estimate(backend, self._clock())
        if est is None:
            return float(out), 1.0, 1.0, out
        kv = est.kv or 0.0
        if est.fill is None:
            return est.queue, kv, kv, out
        return max(0.0, est.fill - 1.0), est.fill, kv, out

    def saturated(self, backend: Backend, now: float) -> bool:
        """Queue ≥ ``max_queue`` or KV cache ≥ ``max_kv_cache``, as estimated now (unknown load
        is never saturated)."""
        est = self.estimate(backend, now)
        if est is None:
            return False
        known = self._known[backend]
        return est.queue >= known.max_queue or (est.kv is not None and est.kv >= known.max_kv)

    def row(self, backend: Backend, now: float) -> dict[str, Any]:
        """Its load as ``/readyz`` and the live view show it."""
        known = self._known[backend]
        load = self.load(backend, now)
        age = None if known.scraped_at is None else round(max(0.0, now - known.scraped_at), 3)
        if load is None:
            return {"known": False, "age_s": age}
        capacity = self.capacity(backend)
        return {
            "known": True,
            "queue": load.queue,
            "running": load.running,
            "kv_cache": load.kv_cache,
            "saturated": self.saturated(backend, now),
            "capacity": None if capacity is None else round(capacity, 2),
            "age_s": age,
        }

    def gauges(self, now: float) -> dict[str, dict[tuple[str, ...], float]]:
        """The per-backend load gauges of ``/metrics`` (docs/spec.md §11, §21) for the backends
        whose load is read; queue, running and KV-cache only while known."""
        queue: dict[tuple[str, ...], float] = {}
        running: dict[tuple[str, ...], float] = {}
        kv_cache: dict[tuple[str, ...], float] = {}
        saturated: dict[tuple[str, ...], float] = {}
        age: dict[tuple[str, ...], float] = {}
        for b, known in self._known.items():
            if not known.watched:
                continue
            key = (b.name,)
            saturated[key] = float(self.saturated(b, now))
            if known.scraped_at is not None:
                age[key] = round(max(0.0, now - known.scraped_at), 3)
            load = self.load(b, now)
            if load is None:
                continue
            queue[key] = load.queue
            if load.running is not None:
                running[key] = load.running
            if load.kv_cache is not None:
                kv_cache[key] = load.kv_cache
        return {
            "gateway_backend_queue_depth": queue,
            "gateway_backend_running_requests": running,
            "gateway_backend_kv_cache_usage_ratio": kv_cache,
            "gateway_backend_saturated": saturated,
            "gateway_backend_metrics_age_seconds": age,
        }


__all__ = ["LEARN", "MAX_FLEET_FACTOR", "Estimate", "Known", "Scorer", "estimate"]
