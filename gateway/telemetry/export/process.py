"""Span export in a process of its own (``[tracing] export_in = "process"``, docs/spec.md §7).

The serving process writes one compact record per kept common request
(:meth:`ProcessExport.put_record`; the exporter builds its spans) and builds the spans of any
other (:meth:`ProcessExport.put_framed`) — and no longer batches, wraps or exports them: each
is appended to a list, and every 50 ms (or every 1024 entries) the list goes as datagrams over a
``SOCK_DGRAM`` Unix socket pair to the exporter process. That socket's buffer is the bounded
ring: when it is full (the exporter is slow, dead or restarting) a send fails at once and its
spans are dropped and counted — a request never waits for it.

The exporter process (``python -m gateway.telemetry.export.child FD``, its settings as JSON on
stdin) runs the same :class:`~gateway.telemetry.export.span_queue.SpanQueue` and exporter as the
in-process path: batches, the OTLP envelope, HTTP/gRPC, retries. It is supervised by a thread of
the serving process: restarted when it dies (what was in the socket's buffer is still there for
the next one), stopped (SIGTERM, flushed within ``shutdown_timeout_s``) with the gateway, and
gone by itself when its parent is. Its counters come back over the same socket pair, once a
second.

A datagram is a run of frames: ``count`` (u32, spans) and ``size`` (u32) then ``size`` bytes of
framed spans — or, with the count's high bit set, of a common request's record (``marshal``),
whose spans the exporter builds (:mod:`gateway.telemetry.spans.record`). A status datagram from
the exporter is ``exported``, ``failed``, ``dropped`` (u64 each) and the Unix time of its last
failure (f64, 0: none).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import marshal
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from gateway import __version__
from gateway.config import TracingConfig
from gateway.telemetry import otlp

log = logging.getLogger("gateway.tracing")

_FRAME = struct.Struct("<II")
_STATUS = struct.Struct("<QQQd")
#: the most bytes one datagram carries (a bigger run of frames is split; one bigger frame is
#: dropped and counted)
MAX_DATAGRAM = 60 * 1024
#: the socket buffer asked for on both ends (the kernel may cap it: net.core.wmem_max)
RING_BYTES = 4 * 1024 * 1024
RESTART_DELAY_S = 0.2
MAX_RESTART_DELAY_S = 5.0
#: pending frames are sent this long after the first of them (or at once beyond FLUSH_FRAMES):
#: one send — and one wake-up of the exporter — per stretch, not per request
FLUSH_S = 0.05
FLUSH_FRAMES = 1024
#: the count's high bit: the frame is a marshalled span record, not framed spans
RECORD = 1 << 31


class ProcessExport:
    """The serving side: the ring's writer and the exporter process's supervisor. It stands
    where a :class:`SpanQueue` would (``put_framed``, ``state``, ``shutdown``, the counters)."""

    def __init__(self, cfg: TracingConfig, resource: dict[str, otlp.AttrValue]) -> None:
        self.cfg = cfg
        self._settings = json.dumps(
            {"tracing": _config_json(cfg), "resource": resource, "version": __version__}
        ).encode()
        self._mine, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for sock in (self._mine, self._theirs):
            for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                with contextlib.suppress(OSError):  # a kernel that refuses: its default
                    sock.setsockopt(socket.SOL_SOCKET, opt, RING_BYTES)
        self._mine.setblocking(False)
        self._pending: list[bytes] = []
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        #: spans dropped here (ring full, or a request's spans over one datagram)
        self.ring_dropped = 0
        #: the exporter's own counters, as it last told them
        self.exported = 0
        self.failed = 0
        self._child_dropped = 0
        self._last_error_at = 0.0
        #: the running exporter has said it is ready (its first status): SIGTERM is then its
        #: orderly stop, not its death mid-import
        self._told = False
        #: exporter processes started after the first (it died)
        self.restarts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(
            target=self._supervise, name="gateway-span-exporter-supervisor", daemon=True
        )
        self._thread.start()
        self._started.wait(10)

    # ------------------------------------------------------------ the serving side's ring

    @property
    def exporter(self) -> ProcessExport:
        return self  # Tracing.state() reads ``queue.exporter.endpoint``

    @property
    def endpoint(self) -> str:
        """The configured endpoint (the exporter process resolves ``OTEL_*`` defaults)."""
        return self.cfg.endpoint or ""

    @property
    def dropped(self) -> int:
        self._read_status()
        return self.ring_dropped + self._child_dropped

    def put(self, spans: Sequence[bytes]) -> None:
        """As :meth:`SpanQueue.put` (realtime spans)."""
        if spans:
            self.put_framed(otlp.frame_spans(spans), len(spans))

    def put_record(self, record: tuple[Any, ...], count: int) -> None:
        """A common request's record (:mod:`gateway.telemetry.spans.record`, ``count`` spans to
        be): its spans are built by the exporter process."""
        data = marshal.dumps(record)
        pending = self._pending
        pending.append(_FRAME.pack(count | RECORD, len(data)) + data)
        if not self._scheduled:
            self._schedule()
        elif len(pending) >= FLUSH_FRAMES:
            self.flush()

    def put_framed(self, block: bytes, count: int) -> None:
        """Called on the event loop: one list append; the sends are batched (:data:`FLUSH_S`)."""
        pending = self._pending
        pending.append(_FRAME.pack(count, len(block)) + block)
        if not self._scheduled:
            self._schedule()
        elif len(pending) >= FLUSH_FRAMES:
            self.flush()

    def _schedule(self) -> None:
        self._scheduled = True
        self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        """Send what is pending as few datagrams as fit; a full ring drops (and counts)."""
        self._scheduled = False
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self._drain()

    def _drain(self) -> None:
        frames, self._pending = self._pending, []
        batch: list[bytes] = []
        size = 0
        for frame in frames:
            if batch and size + len(frame) > MAX_DATAGRAM:
                self._send(batch)
                batch, size = [], 0
            batch.append(frame)
            size += len(frame)
        if batch:
            self._send(batch)

    def _send(self, frames: list[bytes]) -> None:
        try:
            self._mine.send(b"".join(frames))
        except OSError:  # full (BlockingIOError), too big (EMSGSIZE): dropped, never waited for
            self.ring_dropped += sum(_FRAME.unpack_from(f)[0] & ~RECORD for f in frames)

    def _read_status(self) -> None:
        while True:
            try:
                data = self._mine.recv(64)
            except OSError:
                return
            if len(data) == _STATUS.size:
                self._told = True
                self.exported, self.failed, self._child_dropped, self._last_error_at = (
                    _STATUS.unpack(data)
                )

    def state(self) -> str:
        self._read_status()
        if self.process is None or self.process.poll() is not None:
            return "restarting"
        if self._last_error_at and time.time() - self._last_error_at < 30:
            return "failing"
        return "ok"

    # ------------------------------------------------------------ supervision

    def _spawn(self) -> subprocess.Popen[bytes]:
        fd = self._theirs.fileno()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.telemetry.export.child", str(fd)],
            stdin=subprocess.PIPE,
            pass_fds=(fd,),
            start_new_session=True,  # a terminal's ^C goes to the gateway, which stops it
        )
        assert proc.stdin is not None
        proc.stdin.write(self._settings)
        proc.stdin.close()
        return proc

    def _supervise(self) -> None:
        first = True
        delay = RESTART_DELAY_S
        while not self._stopping.is_set():
            try:
                self.process = proc = self._spawn()
            except OSError:
                log.exception("could not start the span exporter process")
                self._stopping.wait(RESTART_DELAY_S * 5)
                continue
            self._told = False
            if not first:
                self.restarts += 1
                log.warning("span exporter process restarted (pid %d)", proc.pid)
            first = False
            self._started.set()
            began = time.monotonic()
            proc.wait()
            if not self._stopping.is_set():
                log.warning("span exporter process %d ended (%s)", proc.pid, proc.returncode)
                # one that dies as it starts is not started again in a tight loop
                lived = time.monotonic() - began
                delay = RESTART_DELAY_S if lived > 10 else min(delay * 2, MAX_RESTART_DELAY_S)
                self._stopping.wait(delay)

    def shutdown(self, timeout_s: float) -> None:
        """Stop the exporter: what is queued is flushed within ``timeout_s``, then it is killed."""
        self._stopping.set()
        self._drain()  # from another thread: the loop's timer is left to find nothing
        proc = self.process
        deadline = time.monotonic() + timeout_s
        while proc is not None and proc.poll() is None and time.monotonic() < deadline:
            self._read_status()
            if self._told:
                break
            time.sleep(0.01)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s + 1)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._thread.join(timeout_s + 1)
        self._read_status()
        self._mine.close()
        self._theirs.close()


def _config_json(cfg: TracingConfig) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    out["explicit"] = sorted(cfg.explicit)
    return out


def _config_of(data: dict[str, Any]) -> TracingConfig:
    fields = {f.name: f for f in dataclasses.fields(TracingConfig)}
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name not in fields:
            continue
        values[name] = tuple(value) if isinstance(value, list) else value
    values["explicit"] = frozenset(data.get("explicit", ()))
    return TracingConfig(**values)


# ---------------------------------------------------------------- the exporter process


def _frames(data: bytes) -> list[tuple[bytes, int]]:
    out = []
    at = 0
    while at + _FRAME.size <= len(data):
        count, size = _FRAME.unpack_from(data, at)
        at += _FRAME.size
        out.append((data[at : at + size], count))
        at += size
    return out


def serve(fd: int, settings: dict[str, Any]) -> int:
    """The exporter process's loop: datagrams in, the span queue out, status back each second."""
    from gateway.telemetry.export import SpanQueue, make_exporter

    cfg = _config_of(settings["tracing"])
    encoder = otlp.RequestEncoder(settings["resource"], "llm-gateway", settings["version"])
    queue = SpanQueue(
        make_exporter(cfg, os.environ),
        encoder,
        max_queue_size=cfg.max_queue_size,
        max_batch=cfg.max_export_batch_size,
        schedule_delay_s=cfg.schedule_delay_ms / 1000,
    )
    sock = socket.socket(fileno=fd)
    sock.settimeout(0.25)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    _tell(sock, queue)  # ready: the gateway's SIGTERM is an orderly stop from now on
    told = time.monotonic()
    while not stop.is_set() and os.getppid() == parent:
        try:
            data = sock.recv(MAX_DATAGRAM + 4096)
        except TimeoutError:
            data = b""
        except InterruptedError:  # pragma: no cover - PEP 475 retries; a signal handler ran
            continue
        for block, count in _frames(data):
            if count & RECORD:
                _build(queue, block, count & ~RECORD)
            else:
                queue.put_framed(block, count)
        now = time.monotonic()
        if now - told >= 1.0:
            told = now
            _tell(sock, queue)
    queue.shutdown(cfg.shutdown_timeout_s)
    _tell(sock, queue)
    return 0


def _build(queue: Any, data: bytes, count: int) -> None:
    """A record's spans, built here; a record that cannot be built is counted as failed."""
    from gateway.telemetry.spans.record import build_record

    try:
        block, n = build_record(marshal.loads(data))
    except Exception:
        log.exception("a span record could not be built")
        queue.failed += count
        return
    queue.put_framed(block, n)


def _tell(sock: socket.socket, queue: Any) -> None:
    status = _STATUS.pack(queue.exported, queue.failed, queue.dropped, queue.last_error_at or 0.0)
    with contextlib.suppress(OSError):  # the gateway is not reading: the next one will do
        sock.send(status, socket.MSG_DONTWAIT)


def main() -> int:
    fd = int(sys.argv[1])
    settings = json.loads(sys.stdin.buffer.read())
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    return serve(fd, settings)
