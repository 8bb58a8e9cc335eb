"""SIGTERM is a graceful drain (SPEC §13): the gateway stops accepting, the stream in flight
finishes, its span is flushed to the collector, and the process exits 0 — with one worker and
with two (gateway/server/supervisor.py; there every worker drains its own streams, and none is left
behind). The gateway runs as `python -m gateway.cli serve`."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.gateway_process import backend_toml, gateway_process
from tests.otlp_receiver import OTLPReceiver
from tests.support import WORDS, paced_upstream

ROUTE = '[[routes]]\nmodels = ["*"]\nbackends = ["up"]\n'
STREAM = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def established_on(port: int) -> set[int]:
    """Socket inodes of the established TCP connections whose local port is ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], int(fields[9])
                if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(inode)
    return inodes


def connections_per_worker(pid: int, port: int) -> dict[int, int]:
    """How many client connections each worker process of the gateway ``pid`` holds."""
    established = established_on(port)
    held = {}
    for child in children(pid):
        count = 0
        for fd in Path(f"/proc/{child}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue  # closed meanwhile
            if target.startswith("socket:[") and int(target[8:-1]) in established:
                count += 1
        held[child] = count
    return held


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except (ConnectionRefusedError, TimeoutError, OSError):
        return True


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_during_a_stream_finishes_it_flushes_its_span_and_exits_0(
    tmp_path, upstream, workers
):
    sent: list[float] = []
    up = upstream(paced_upstream(sent, gap=0.25))  # 9 events over ~2.25 s
    with OTLPReceiver("http") as otlp:
        config = (
            backend_toml("up", up.url)
            + ROUTE
            + f'[tracing]\nexporter = "otlp"\nendpoint = "{otlp.endpoint}"\n'
            + 'protocol = "http/protobuf"\n'
        )
        with gateway_process(
            tmp_path, config, workers=workers, server_extra="shutdown_grace_s = 20"
        ) as gw:
            conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
            conn.request(
                "POST",
                "/v1/chat/completions",
                body=STREAM,
                headers={"content-type": "application/json"},
            )
            resp = conn.getresponse()
            assert resp.status == 200
            trace_id = resp.getheader("traceresponse", "").split("-")[1]
            first = resp.readline()
            assert first.startswith(b"data: ")
            signalled_after = len(sent)
            gw.proc.send_signal(signal.SIGTERM)
            # stops accepting while the stream is still running
            deadline = time.monotonic() + 5
            while not refuses_connections(gw.port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert refuses_connections(gw.port), "still accepting after SIGTERM"
            assert len(sent) < len(WORDS) + 1, "the stream ended before the check"
            rest = resp.read()
            conn.close()
            assert gw.proc.wait(30) == 0
        body = first + rest
        assert body.count(b"data: {") == len(WORDS) + 1  # every word and the finish
        assert body.rstrip().endswith(b"data: [DONE]")
        assert signalled_after < len(WORDS)
        # the span of the drained stream reached the collector before the process ended
        assert any(s.trace_id == trace_id for s in otlp.spans), otlp.dump()


def test_sigterm_with_nothing_in_flight_exits_0_at_once(tmp_path, upstream):
    up = upstream(paced_upstream([], gap=0.01))
    with gateway_process(tmp_path, backend_toml("up", up.url) + ROUTE) as gw:
        started = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(10) == 0
        assert time.monotonic() - started < 5  # nothing to wait for (generous: a behaviour)


def test_grace_over_cuts_what_is_left_and_still_exits_0(tmp_path, upstream):
    sent: list[float] = []
    up = upstream(paced_upstream(sent, gap=1.0))  # ~9 s: longer than the grace
    with gateway_process(
        tmp_path, backend_toml("up", up.url) + ROUTE, server_extra="shutdown_grace_s = 1"
    ) as gw:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=STREAM)
        resp = conn.getresponse()
        assert resp.readline().startswith(b"data: ")
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(15) == 0
        with pytest.raises(http.client.IncompleteRead):
            resp.read()  # cut: the chunked body never ends (never mistaken for complete)
        conn.close()


def open_stream(port: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request("POST", "/v1/chat/completions", body=STREAM)
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.readline()
    assert first.startswith(b"data: ")
    return conn, resp, first


def test_with_two_workers_sigterm_drains_the_streams_of_each_and_exits_0(tmp_path, upstream):
    sent: list[float] = []
    up = upstream(paced_upstream(sent, gap=1.0))  # 9 events over ~9 s
    with gateway_process(
        tmp_path,
        backend_toml("up", up.url) + ROUTE,
        workers=2,
        server_extra="shutdown_grace_s = 20",
    ) as gw:
        # streams until each worker holds at least one. Which worker accepts is the kernel's
        # choice, and a worker still starting (importing) accepts nothing: keep opening, paced,
        # within a bound shorter than a stream (every stream is still in flight at SIGTERM)
        streams = [open_stream(gw.port)]
        try:
            held = connections_per_worker(gw.proc.pid, gw.port)
            while len(streams) < 35 and sorted(held.values())[-2:][0] == 0:
                time.sleep(0.2)
                streams.append(open_stream(gw.port))
                held = connections_per_worker(gw.proc.pid, gw.port)
            workers = [pid for pid, n in held.items() if n]
            assert len(workers) == 2, f"connections per child process: {held}"
            assert sum(held.values()) == len(streams)
            gw.proc.send_signal(signal.SIGTERM)
            bodies = [first + resp.read() for _, resp, first in streams]
        finally:
            for conn, _, _ in streams:
                conn.close()
        assert gw.proc.wait(30) == 0
        for body in bodies:
            assert body.count(b"data: {") == len(WORDS) + 1  # every word and the finish
            assert body.rstrip().endswith(b"data: [DONE]")
        # the workers ended with the supervisor (none left behind)
        assert not [pid for pid in workers if running(pid)]


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "(zombie)" not in status
