"""``GET /metrics``: the exposition, and the snapshots that make one scrape count every worker.

``workers > 1`` (one scrape of the shared port must give every worker's totals): each worker
writes a snapshot of its aggregates to a shared directory (``$GATEWAY_METRICS_DIR``, made by
``gateway serve``) once a second, at every scrape and at shutdown; the worker that answers a scrape
writes its own snapshot first, then merges every worker's file. Every scrape therefore reads
only files, and files only grow, so a counter never goes backwards between two scrapes answered
by different workers; another worker's numbers are at most one second old. Exemplars survive the
merge (the newest per bucket). Gauges count only workers that are alive. prometheus-client's own
multiprocess mode was not used: it drops exemplars and takes a lock per observation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from gateway.telemetry.metrics.recorder import Metrics

log = logging.getLogger("gateway.metrics")

METRICS_DIR_ENV = "GATEWAY_METRICS_DIR"
SNAPSHOT_INTERVAL_S = 1.0


class WorkerSnapshots:
    """Snapshot files of the workers sharing one port (see the module docstring)."""

    def __init__(self, directory: str, metrics: Metrics) -> None:
        self.dir = Path(directory)
        self.metrics = metrics
        self.path = self.dir / f"worker-{os.getpid()}.json"

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.metrics.snapshot()))
        os.replace(tmp, self.path)

    def read_all(self) -> list[dict[str, Any]]:
        """Every worker's snapshot; gauges only from workers still alive."""
        out = []
        for path in sorted(self.dir.glob("worker-*.json")):
            try:
                snap = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # a file being replaced or a torn one: the next scrape has it
            if snap.get("pid") != os.getpid() and not _alive(int(snap.get("pid", 0))):
                snap["gauges"] = {}
            out.append(snap)
        return out


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def scrape_snapshots(metrics: Metrics, workers: WorkerSnapshots | None) -> list[dict[str, Any]]:
    if workers is None:
        return [metrics.snapshot()]
    with contextlib.suppress(OSError):
        workers.write()
    return workers.read_all()


class Exposition:
    """``GET /metrics``: content negotiation (text 0.0.4, or OpenMetrics with exemplars)."""

    def __init__(self, metrics: Metrics, workers: WorkerSnapshots | None) -> None:
        self.metrics = metrics
        self.workers = workers
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.workers is not None:
            self._task = asyncio.get_running_loop().create_task(self._snapshots(self.workers))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.workers is not None:  # a stopped worker's totals still count
            with contextlib.suppress(OSError):
                self.workers.write()

    @staticmethod
    async def _snapshots(workers: WorkerSnapshots) -> None:
        while True:
            try:
                workers.write()
            except OSError as exc:
                log.warning("metrics snapshot not written: %s", exc)
            await asyncio.sleep(SNAPSHOT_INTERVAL_S)

    def render(self, accept: str) -> tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        snapshots = scrape_snapshots(self.metrics, self.workers)
        return encoder(_Families(self.metrics, snapshots)), content_type


class _Families:
    """What prometheus-client's encoders call ``collect()`` on (a registry stand-in)."""

    def __init__(self, metrics: Metrics, snapshots: list[dict[str, Any]]) -> None:
        self._metrics = metrics
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        return self._metrics.families(self._snapshots)


__all__ = ["METRICS_DIR_ENV", "SNAPSHOT_INTERVAL_S", "Exposition", "WorkerSnapshots"]
