"""A real Arize Phoenix for the tests: its own venv (``.phoenix/``, beside ``.venv``), its server
on free loopback ports, its data in the test's temporary directory.

Phoenix (PyPI ``arize-phoenix``) brings hundreds of MB of dependencies of its own (SQLAlchemy,
pandas, grpcio, …) whose versions the suite does not choose, so it lives in a venv of its own
rather than beside the test dependencies (whose lowest versions ``scripts/lowest`` tries).
``scripts/setup`` makes it (``python -m tests.phoenix_support``); a test that finds it missing
makes it too, once, under a lock, within :data:`INSTALL_TIMEOUT_S`, and it is kept across runs
(``.phoenix/`` is gitignored). Phoenix is started with its telemetry off, on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2

from tests.support import free_port

#: the version the suite is tested with (its REST and GraphQL APIs are what the test reads)
PHOENIX_VERSION = "20.26.1"
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".phoenix"
#: written after a complete install: a venv without it (an install cut short) is made again
STAMP = VENV / "installed-version"
INSTALL_TIMEOUT_S = 1500
START_TIMEOUT_S = 120


def installed() -> bool:
    return STAMP.is_file() and STAMP.read_text().strip() == PHOENIX_VERSION


def ensure_installed() -> Path:
    """``.phoenix/bin/phoenix``, installing Phoenix first when it is missing (once, locked)."""
    ROOT.joinpath(".phoenix.lock").touch()
    with open(ROOT / ".phoenix.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed():
            shutil.rmtree(VENV, ignore_errors=True)
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(VENV)], check=True, timeout=120)
            pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
            subprocess.run(
                [*pip, "--disable-pip-version-check", f"arize-phoenix=={PHOENIX_VERSION}"],
                check=True,
                timeout=INSTALL_TIMEOUT_S,
            )
            STAMP.write_text(PHOENIX_VERSION + "\n")
    return VENV / "bin" / "phoenix"


class Phoenix:
    """``phoenix serve`` on free loopback ports (HTTP: UI, REST, GraphQL and OTLP/HTTP at
    ``/v1/traces``; gRPC: OTLP/gRPC), its database in a temporary directory."""

    def __init__(self) -> None:
        self.port = free_port()
        self.grpc_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.mkdtemp(prefix="phoenix-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = Path(self._dir) / "server.log"

    def start(self) -> Phoenix:
        program = ensure_installed()
        env = {
            **os.environ,
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_WORKING_DIR": self._dir,
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                [str(program), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"phoenix exited {self._proc.returncode}: {self.log()}")
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"phoenix did not answer within {START_TIMEOUT_S} s: {self.log()}")

    def log(self) -> str:
        return self._log.read_text(errors="replace")[-3000:] if self._log.exists() else ""

    def graphql(self, query: str) -> Any:
        r = httpx2.post(self.url + "/graphql", json={"query": query}, timeout=10)
        r.raise_for_status()
        body = r.json()
        assert "errors" not in body, body
        return body["data"]

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Phoenix:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def phoenix() -> Iterator[Phoenix]:
    with Phoenix() as server:
        yield server


if __name__ == "__main__":  # scripts/setup: make the venv now
    print(ensure_installed())
