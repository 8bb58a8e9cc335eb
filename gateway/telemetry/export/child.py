"""``python -m gateway.telemetry.export.child FD``: the exporter process's entry point
(:mod:`gateway.telemetry.export.process`; a module of its own, so the one it runs is imported
once)."""

from __future__ import annotations

import sys

from gateway.telemetry.export.process import main

if __name__ == "__main__":
    sys.exit(main())
