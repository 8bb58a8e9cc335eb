"""SIGTERM is a graceful drain (SPEC §13): the gateway stops accepting, the stream in flight
finishes, its span is flushed to the collector, and the process exits 0 — with one worker and
with two (uvicorn's supervisor). The gateway runs as `python -m gateway.cli serve`."""

from __future__ import annotations

import http.client
import signal
import socket
import time

import pytest

from tests.gateway_process import backend_toml, gateway_process
from tests.otlp_receiver import OTLPReceiver
from tests.support import WORDS, paced_upstream

ROUTE = '[[routes]]\nmodels = ["*"]\nbackends = ["up"]\n'
STREAM = b'{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'


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
