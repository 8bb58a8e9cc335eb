"""SPEC §7 ``[tracing] export_in = "process"``: spans exported by a supervised exporter process
fed through a bounded socket buffer. Real sockets, the real OTLP receiver, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx2

from gateway.config import TracingConfig
from gateway.telemetry.export.process import _config_json, _config_of
from tests.gateway_process import backend_toml, gateway_process
from tests.support import GatewayServer, config_for

MSG = [{"role": "user", "content": "export me elsewhere"}]


def process_config(upstream_url: str, receiver, extra: str = ""):
    return config_for(
        upstream_url,
        extra=f"""
[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
sample_ratio = 1.0
schedule_delay_ms = 50
export_in = "process"
shutdown_timeout_s = 1
{extra}
""",
    )


def chat(gw, model: str) -> int:
    r = httpx2.post(gw.base_url + "/chat/completions", json={"model": model, "messages": MSG})
    return r.status_code


def test_spans_reach_the_receiver_through_the_exporter_process(gateway, mock_upstream, receiver):
    gw = gateway(process_config(mock_upstream.url + "/v1", receiver))
    queue = gw.app.tracing.queue
    assert queue.process is not None and queue.process.pid != os.getpid()
    assert chat(gw, "via-process") == 200
    spans = receiver.wait_for(lambda ss: any(s.name == "chat via-process" for s in ss))
    root = next(s for s in spans if s.kind == "SERVER")
    assert len(receiver.trace(root.trace_id)) >= 4  # root, hops, the CLIENT span
    # the exporter's counters come back to /readyz
    deadline = time.monotonic() + 5
    while queue.exported == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        ready = httpx2.get(gw.url + "/readyz").json()
    assert ready["tracing"]["export_in"] == "process" and ready["tracing"]["exported"] >= 4
    assert ready["tracing"]["exporter_pid"] == queue.process.pid


def test_killing_the_exporter_under_load_fails_no_request_and_it_comes_back(
    gateway, mock_upstream, receiver
):
    gw = gateway(process_config(mock_upstream.url + "/v1", receiver))
    queue = gw.app.tracing.queue
    first = queue.process
    statuses: list[int] = []
    stop = threading.Event()

    def load(worker: int) -> None:
        with httpx2.Client() as client:
            i = 0
            while not stop.is_set():
                r = client.post(
                    gw.base_url + "/chat/completions",
                    json={"model": f"load-{worker}-{i}", "messages": MSG},
                )
                statuses.append(r.status_code)
                i += 1

    threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        receiver.wait_for(lambda ss: len(ss) >= 20)
        before_kill = len(statuses)
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (queue.process is first or queue.restarts < 1) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert queue.restarts >= 1 and queue.process is not first
        assert queue.process.poll() is None  # the new one runs
        receiver.clear()
        after_restart = len(statuses)
        # spans of requests made after the restart reach the receiver
        receiver.wait_for(lambda ss: sum(s.kind == "SERVER" for s in ss) >= 20)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert first.poll() == -signal.SIGKILL
    assert len(statuses) > after_restart > before_kill  # serving went on throughout
    assert set(statuses) == {200}
    assert chat(gw, "after-the-restart") == 200
    receiver.wait_for(lambda ss: any(s.name == "chat after-the-restart" for s in ss))


def test_the_exporter_process_stops_with_the_gateway(mock_upstream, receiver):
    gw = GatewayServer(process_config(mock_upstream.url + "/v1", receiver)).start()
    proc = gw.app.tracing.queue.process
    assert chat(gw, "last-words") == 200
    gw.stop()
    # stopped, not killed: it flushed what it had (SIGTERM ends it with status 0)
    assert proc.wait(5) == 0
    assert any(s.name == "chat last-words" for s in receiver.spans)


def test_the_settings_cross_to_the_exporter_process_intact():
    cfg = TracingConfig(
        exporter="otlp",
        endpoint="http://127.0.0.1:4318",
        keep=("error", "slow:1s"),
        redact=("sk-[a-z]+",),
        export_in="process",
        explicit=frozenset({"exporter", "endpoint"}),
    )
    assert _config_of(_config_json(cfg)) == cfg
    assert _config_of(_config_json(cfg)).explicit == cfg.explicit


def test_a_full_ring_drops_and_counts_and_never_blocks(gateway, mock_upstream, receiver):
    gw = gateway(process_config(mock_upstream.url + "/v1", receiver))
    queue = gw.app.tracing.queue
    proc = queue.process
    assert chat(gw, "warm") == 200
    receiver.wait_for(lambda ss: any(s.name == "chat warm" for s in ss))
    os.kill(proc.pid, signal.SIGSTOP)  # the exporter reads nothing: the socket buffer fills
    try:
        statuses = []
        with httpx2.Client() as client:
            while queue.ring_dropped == 0 and len(statuses) < 20000:
                r = client.post(
                    gw.base_url + "/chat/completions",
                    json={"model": "while-stopped", "messages": MSG},
                )
                statuses.append(r.status_code)
        assert set(statuses) == {200}
        assert queue.ring_dropped > 0
        ready = httpx2.get(gw.url + "/readyz").json()
        assert ready["status"] == "ready" and ready["tracing"]["dropped"] >= queue.ring_dropped
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    # the exporter runs again: once it has worked through the backlog (what its own queue
    # cannot hold it drops and counts), new requests' spans reach the receiver again
    deadline = time.monotonic() + 30
    seen = False
    while not seen and time.monotonic() < deadline:
        assert chat(gw, "after-the-stop") == 200
        time.sleep(0.2)
        seen = any(s.name == "chat after-the-stop" for s in receiver.spans)
    assert seen
    assert queue.restarts == 0


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _exporters(pid: int) -> list[int]:
    """The span exporter processes under the gateway ``pid`` (its workers' children)."""
    found = []
    for worker in _children(pid):
        for child in [worker, *_children(worker)]:
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"gateway.telemetry.export.child" in cmd:
                found.append(child)
    return found


def test_gateway_serve_runs_one_exporter_per_worker_and_stops_them(
    tmp_path, mock_upstream, receiver
):
    body = backend_toml("up", mock_upstream.url + "/v1") + (
        '[[routes]]\nmodels = ["*"]\nbackends = ["up"]\n'
        f'[tracing]\nexporter = "otlp"\nendpoint = "{receiver.endpoint}"\n'
        'sample_ratio = 1.0\nschedule_delay_ms = 50\nexport_in = "process"\n'
        "shutdown_timeout_s = 1\n"
    )
    with gateway_process(tmp_path, body, workers=2) as gw:
        for i in range(20):
            r = httpx2.post(
                gw.url + "/v1/chat/completions", json={"model": f"served-{i}", "messages": MSG}
            )
            assert r.status_code == 200
        receiver.wait_for(lambda ss: sum(s.kind == "SERVER" for s in ss) >= 20)
        exporters = _exporters(gw.proc.pid)
        assert len(exporters) == 2  # one per worker
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(15) == 0
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{p}").exists() for p in exporters) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in exporters if Path(f"/proc/{p}").exists()]
