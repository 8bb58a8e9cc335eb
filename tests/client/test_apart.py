"""The client-side tools stay apart from the server (docs/architecture.md): nothing that
``gateway serve`` loads imports :mod:`gateway.client`."""

from __future__ import annotations

import subprocess
import sys

SERVER_MODULES = (
    "gateway.cli",
    "gateway.server.process",
    "gateway.server.worker",
    "gateway.app",
    "gateway.endpoints",
)


def test_the_server_never_imports_the_client_tools():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in SERVER_MODULES)
        + "print(sorted(m for m in sys.modules if m.startswith('gateway.client')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
