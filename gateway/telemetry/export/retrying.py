"""What every OTLP exporter shares: one attempt's :class:`Outcome`, the retry loop (exponential
backoff with jitter, or the collector's own delay, all within the export timeout) and the
error log that says a failure once, then at most once per interval."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.telemetry.export.settings import EncodedBatch, OTLPSettings

log = logging.getLogger("gateway.tracing")


class FailureLog:
    """The exporter's error log: the first failure at once, then one summary per ``interval_s``.

    A collector that is down for an hour costs ~60 log lines, not one per batch; the recovery
    is logged too. Reasons never include header values (they are never put in one).
    """

    def __init__(
        self,
        endpoint: str,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        what: str = "span",
    ) -> None:
        self._endpoint = endpoint
        #: what is exported, in the lines: "span" or "metric"
        self._what = what
        self._interval = interval_s
        self._clock = clock
        self._failing = False
        self._last_report = 0.0
        self._batches = 0
        self._spans = 0

    @property
    def failing(self) -> bool:
        return self._failing

    def failure(self, spans: int, reason: str) -> None:
        now = self._clock()
        self._batches += 1
        self._spans += spans
        if not self._failing:
            self._failing = True
            log.warning(
                "%s export to %s failed: %s; %d %ss dropped (further failures are "
                "reported at most every %g s)",
                self._what,
                self._endpoint,
                reason,
                spans,
                self._what,
                self._interval,
            )
        elif now - self._last_report >= self._interval:
            log.warning(
                "%s export to %s still failing: %d batches (%d %ss) dropped in the last "
                "%.0f s; last error: %s",
                self._what,
                self._endpoint,
                self._batches,
                self._spans,
                self._what,
                now - self._last_report,
                reason,
            )
        else:
            return
        self._last_report = now
        self._batches = self._spans = 0

    def success(self) -> None:
        if self._failing:
            self._failing = False
            log.info(
                "%s export to %s recovered (%d batches, %d %ss dropped since the last report)",
                self._what,
                self._endpoint,
                self._batches,
                self._spans,
                self._what,
            )
            self._batches = self._spans = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """One export attempt: accepted, or why not and whether (and when) to try again."""

    ok: bool
    reason: str = ""
    retryable: bool = False
    retry_after_s: float | None = None


_OK = Outcome(ok=True)


class _RetryingExporter:
    """Retries on retryable outcomes, exponential backoff with jitter, all within the timeout."""

    endpoint: str
    protocol: str

    def __init__(
        self, settings: OTLPSettings, backoff_s: float, max_backoff_s: float, what: str = "span"
    ) -> None:
        self._timeout = settings.timeout_s
        self._backoff = backoff_s
        self._max_backoff = max_backoff_s
        self._closed = threading.Event()
        self._log = FailureLog(self.endpoint, what=what)

    def _attempt(self, data: bytes, timeout_s: float) -> Outcome:
        raise NotImplementedError

    def _payload(self, data: bytes) -> bytes:
        return data

    def export(self, batch: EncodedBatch) -> bool:
        """Send one batch; False (logged, rate limited) when it could not be delivered in time."""
        if self._closed.is_set():
            return False
        deadline = time.monotonic() + self._timeout
        data = self._payload(batch.data)
        attempt = 0
        while True:
            try:
                outcome = self._attempt(data, max(deadline - time.monotonic(), 0.001))
            except Exception as exc:  # a bug or an unexpected library error: not retried
                outcome = Outcome(ok=False, reason=f"{type(exc).__name__}: {exc}")
            if outcome.ok:
                self._log.success()
                return True
            if not outcome.retryable or self._closed.is_set():
                break
            delay = outcome.retry_after_s
            if delay is None:
                delay = min(self._backoff * 2**attempt, self._max_backoff)
                delay *= random.uniform(0.8, 1.2)  # jitter: replicas must not retry in step
            attempt += 1
            if time.monotonic() + delay >= deadline:
                outcome = Outcome(
                    ok=False, reason=f"{outcome.reason} (gave up after {attempt} attempts)"
                )
                break
            if self._closed.wait(delay):
                break
        self._log.failure(batch.count, outcome.reason)
        return False
