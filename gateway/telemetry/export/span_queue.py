"""The span queue: a request only appends its encoded spans (O(1), no lock, no I/O); one worker
thread joins them into batches and hands each to the exporter."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

from gateway.telemetry.export.settings import BatchExporter, EncodedBatch
from gateway.telemetry.otlp import RequestEncoder, frame_spans

log = logging.getLogger("gateway.tracing")


class SpanQueue:
    """Bounded queue + worker thread (the BatchSpanProcessor's job, for encoded spans).

    An entry is one request's spans, already framed as ``ScopeSpans.spans`` fields
    (:func:`gateway.telemetry.otlp.frame_spans`) with their count: a batch is one join of
    entries. The queue's size and the batch size count spans; a request's spans are queued
    (and dropped, when the queue is full) together."""

    def __init__(
        self,
        exporter: BatchExporter,
        encoder: RequestEncoder,
        *,
        max_queue_size: int,
        max_batch: int,
        schedule_delay_s: float,
    ) -> None:
        self.exporter = exporter
        self._encoder = encoder
        self._queue: collections.deque[tuple[bytes, int]] = collections.deque()
        self._max_queue = max_queue_size
        self._max_batch = max_batch
        self._delay = schedule_delay_s
        self._wake = threading.Event()
        self._stopping = False
        #: spans ever queued (written on the event loop only) and taken (by the worker only):
        #: their difference is what is queued, with no lock and no shared read-modify-write
        self._queued = 0
        self._taken = 0
        #: counters, read by /readyz and (later) /metrics
        self.dropped = 0
        self.exported = 0
        self.failed = 0
        self.last_error_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="gateway-span-export", daemon=True)
        self._thread.start()

    def put(self, spans: Sequence[bytes]) -> None:
        """Called on the event loop: never blocks, never does I/O."""
        if spans:
            self.put_framed(frame_spans(spans), len(spans))

    def put_framed(self, block: bytes, count: int) -> None:
        """Queue ``count`` spans framed by :func:`~gateway.telemetry.otlp.frame_spans` (all or,
        when the queue has no room for them, none: counted as dropped)."""
        queued = self._queued - self._taken
        if queued + count > self._max_queue:
            self.dropped += count
            return
        self._queue.append((block, count))
        self._queued += count
        # set once per batch, not on every put until the worker runs: Event.set takes a lock
        # and notifies
        if queued + count >= self._max_batch and not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            while self._queue:
                self._export_some()
                if self._stopping:
                    break
            if self._stopping:
                return

    def _export_some(self) -> None:
        q = self._queue
        blocks: list[bytes] = []
        count = 0
        # only this thread takes entries (but shutdown() after its timeout: hence the guards)
        while q:
            try:
                if blocks and count + q[0][1] > self._max_batch:
                    break
                block, n = q.popleft()
            except IndexError:
                break
            blocks.append(block)
            count += n
        if not blocks:
            return
        self._taken += count
        ok = False
        try:
            ok = self.exporter.export(EncodedBatch(self._encoder.request_framed(blocks), count))
        except Exception:  # the exporter must never kill the worker
            log.exception("span export failed")
        if ok:
            self.exported += count
        else:
            self.failed += count
            self.last_error_at = time.time()

    def state(self) -> str:
        if self.last_error_at is not None and time.time() - self.last_error_at < 30:
            return "failing"
        return "ok"

    def shutdown(self, timeout_s: float) -> None:
        """Flush what is queued, waiting at most ``timeout_s``; then drop the rest."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        while self._queue and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.01)
        self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        left = 0
        while self._queue:
            left += self._queue.popleft()[1]
        self._taken += left
        self.dropped += left
        try:
            self.exporter.shutdown()
        except Exception:
            log.exception("span exporter shutdown failed")
