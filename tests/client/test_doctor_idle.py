"""The doctor's ``idle`` row (docs/spec.md §17, §27): against the gateway over TLS (h2 by ALPN)
and in clear (h2c by prior knowledge) an idle connection ends with GOAWAY; HTTP/1.1 has none;
a server that drops an idle HTTP/2 connection silently fails the row."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import h2.config
import h2.connection
import h2.events
import pytest

from gateway.client.doctor.idle_close import check_idle
from tests.client.doctor_support import checks_by_name, doctor_json
from tests.h2.support import MOCK, make_certs
from tests.support import gateway_config

IDLE = "[server.http2]\nidle_timeout_s = 1\n"


@pytest.mark.parametrize("tls", [True, False], ids=["h2", "h2c"])
def test_the_gateway_ends_an_idle_connection_with_goaway(gateway, tmp_path, tls):
    if tls:
        certs = make_certs(tmp_path)
        gw = gateway(gateway_config(MOCK + certs.toml() + IDLE))
        args = ["--cacert", str(certs.ca_pem)]
    else:
        gw = gateway(gateway_config(MOCK + "[server]\nh2c = true\n" + IDLE))
        args = []
    _, report = doctor_json(gw.base_url, "--idle-wait", "5", *args)
    idle = checks_by_name(report)["idle"]
    assert idle["verdict"] == "ok", idle
    assert idle["value"].startswith("GOAWAY NO_ERROR (idle_timeout) after ")
    assert idle["detail"].startswith("h2 (ALPN)" if tls else "h2c (prior knowledge)")
    assert "GET /models: HTTP 200" in idle["detail"]
    if tls:
        assert checks_by_name(report)["http2"]["value"].startswith("HTTP/2, 1 connection")


def test_http1_has_no_goaway_and_a_short_wait_is_not_judged(gateway):
    gw = gateway(gateway_config(MOCK))  # HTTP/1.1 only: its keep-alive ends after 5 s
    closed = check_idle(gw.base_url, 8, api_key=None, cacert=None, timeout=10)
    assert closed.verdict == "skip"
    assert isinstance(closed.value, str) and closed.value.startswith("HTTP/1.1, closed after")
    assert "no GOAWAY" in closed.hint
    h2c = gateway(gateway_config(MOCK + "[server]\nh2c = true\n"))  # idle timeout 60 s
    still = check_idle(h2c.base_url, 0.5, api_key=None, cacert=None, timeout=10)
    assert (still.verdict, still.value) == ("skip", "open after 0.5 s")


@contextmanager
def silent_h2c_server() -> Iterator[int]:
    """An h2c server that answers one request, then drops the connection after 0.3 s with no
    GOAWAY: what the row exists to catch."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        sock, _ = listener.accept()
        with sock:
            conn = h2.connection.H2Connection(
                config=h2.config.H2Configuration(client_side=False, header_encoding=None)
            )
            conn.initiate_connection()
            sock.sendall(conn.data_to_send())
            answered = False
            while not answered:
                data = sock.recv(65536)
                if not data:
                    return
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        conn.send_headers(event.stream_id, [(b":status", b"200")])
                        conn.send_data(event.stream_id, b'{"data": []}', end_stream=True)
                        answered = True
                sock.sendall(conn.data_to_send())
            sock.settimeout(0.3)
            with contextlib.suppress(TimeoutError):
                sock.recv(65536)
            # then closed, silently

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        listener.close()
        thread.join(5)


def test_a_silent_close_of_an_idle_http2_connection_fails():
    with silent_h2c_server() as port:
        check = check_idle(f"http://127.0.0.1:{port}/v1", 5, api_key=None, cacert=None, timeout=5)
    assert check.verdict == "fail", check
    assert isinstance(check.value, str) and check.value.startswith("closed silently after")
    assert "without GOAWAY" in check.hint
