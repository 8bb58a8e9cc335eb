"""``[server.tls]`` in a gateway process (docs/spec.md §27): SIGHUP re-reads the certificate
without dropping a connection, files that cannot be used are a one-line startup error (or, on
SIGHUP, leave the old certificate in place), and ``--workers`` pass SIGHUP on."""

from __future__ import annotations

import os
import select
import signal
import ssl
import subprocess
import time

import httpx2
import pytest
import trustme

from tests.gateway_process import gateway_process
from tests.h2.support import MOCK, H2Client
from tests.support import Process, free_port, gateway_cli


def ask(port: int, ctx: ssl.SSLContext) -> str:
    with httpx2.Client(http2=True, verify=ctx) as http:
        answer = http.get(f"https://127.0.0.1:{port}/healthz")
        assert answer.status_code == 200
        return answer.http_version


def logged(proc: Process, text: str, times: int) -> str:
    """Read the process's log (its stdout) until ``text`` is in it ``times`` times (each
    worker logs its own re-read)."""
    out = proc.proc.stdout
    assert out is not None
    deadline = time.monotonic() + 15
    while proc.output.count(text) < times:
        assert time.monotonic() < deadline, proc.output
        if select.select([out], [], [], 0.5)[0]:  # the pipe itself, no buffered reader
            proc.output += os.read(out.fileno(), 65536).decode(errors="replace")
    return proc.output


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_rereads_the_certificate_without_dropping_a_connection(
    tmp_path, certs, workers, monkeypatch
):
    monkeypatch.setenv("GATEWAY__LOGGING__LEVEL", "info")  # the re-read's line
    with gateway_process(tmp_path, MOCK + certs.toml(), workers) as proc:
        old_trust = certs.client_context()
        assert ask(proc.port, old_trust) == "HTTP/2"
        with H2Client(proc.port, certs.client_context()) as kept:
            assert kept.answer(kept.request("GET", "/healthz")).status == 200
            new_ca = trustme.CA()
            certs.reissue(new_ca)
            proc.proc.send_signal(signal.SIGHUP)
            logged(proc, "TLS certificate re-read", workers)
            new_trust = ssl.create_default_context()
            new_ca.configure_trust(new_trust)
            new_trust.set_alpn_protocols(["h2"])
            for _ in range(4):  # whichever worker takes the connection
                assert ask(proc.port, new_trust) == "HTTP/2"
                with pytest.raises(httpx2.ConnectError):
                    ask(proc.port, old_trust)
            # the connection made before the reload goes on, on its old certificate
            assert kept.answer(kept.request("GET", "/healthz")).status == 200
            assert kept.goaway is None
        # a key that does not match: the certificate in place stays
        certs.key.write_bytes(trustme.CA().issue_cert("127.0.0.1").private_key_pem.bytes())
        proc.proc.send_signal(signal.SIGHUP)
        output = logged(proc, "the TLS certificate was not replaced", workers)
        assert "key values mismatch" in output
        for _ in range(4):
            assert ask(proc.port, new_trust) == "HTTP/2"


@pytest.mark.parametrize(
    ("which", "expected"),
    [
        ("key_file", "[server.tls] key_file: cannot read"),
        ("cert_file", "[server.tls] cert_file: cannot read"),
    ],
)
def test_a_file_that_cannot_be_read_is_a_startup_failure(tmp_path, certs, which, expected):
    missing = tmp_path / "missing.pem"
    toml = certs.toml().replace(str(getattr(certs, which.split("_")[0])), str(missing))
    config = tmp_path / "gateway.toml"
    config.write_text(f"[server]\nport = {free_port()}\n" + MOCK + toml)
    out = subprocess.run(
        gateway_cli("serve", "-c", str(config)), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 3
    assert expected in out.stderr and str(missing) in out.stderr
    assert "serving on" not in out.stderr


def test_check_config_names_the_tls_keys(tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text(MOCK + '[server.tls]\ncert_file = ""\nmin_version = "1.1"\n')
    out = subprocess.run(
        gateway_cli("check-config", str(config)), capture_output=True, text=True, timeout=30
    )
    assert out.returncode != 0
    for line in ("server.tls.key_file: required key is missing", "server.tls.min_version"):
        assert line in out.stdout + out.stderr
