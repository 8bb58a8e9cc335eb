"""loadtests/locustfile.py runs headless against a real gateway (a short, bounded smoke run)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from tests.support import gateway_config

ROOT = Path(__file__).resolve().parent.parent


def test_locustfile_drives_every_user_type_without_failures(gateway, tmp_path):
    gw = gateway(
        gateway_config("""
[[backends]]
name = "mock"
url = "mock://?tokens_per_s=2000"
[[routes]]
models = ["*"]
backends = ["mock"]
[logging]
access_log = "off"
""")
    )
    prefix = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "loadtests/locustfile.py"),
            "--headless",
            "-u",
            "4",
            "-r",
            "4",
            "-t",
            "4s",
            "--host",
            gw.url,
            "--csv",
            str(prefix),
            "--only-summary",
            "--exit-code-on-error",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    with open(f"{prefix}_stats.csv") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    for key in [
        ("POST", "chat"),
        ("POST", "chat stream"),
        ("POST", "embeddings"),
        ("POST", "chat (repeated, cacheable)"),
        ("TTFT", "chat stream"),
    ]:
        assert int(rows[key]["Request Count"]) > 0, key
        assert int(rows[key]["Failure Count"]) == 0, key
    # the repeated prompts were served from the cache
    assert int(rows[("CACHE", "HIT")]["Request Count"]) > 0
