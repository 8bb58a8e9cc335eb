"""loadtests/locustfile.py runs headless against a real gateway (a short, bounded smoke run)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from tests.support import (
    LAST_CHUNK,
    chunk,
    config_for,
    gateway_config,
    http_response,
    sse_head,
)

ROOT = Path(__file__).resolve().parent.parent


def run_locust(host: str, tmp_path: Path, seconds: int) -> dict[tuple[str, str], dict[str, str]]:
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
            f"{seconds}s",
            "--host",
            host,
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
        return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}


def test_locustfile_drives_every_user_type_without_failures(gateway, tmp_path):
    """A 10 s headless smoke run: every user type, zero failures."""
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
    rows = run_locust(gw.url, tmp_path, 10)
    for key in [
        ("POST", "chat"),
        ("POST", "chat stream"),
        ("POST", "embeddings"),
        ("POST", "chat (repeated, cacheable)"),
        ("TTFT", "chat stream"),
        ("TBT", "chat stream"),
    ]:
        assert int(rows[key]["Request Count"]) > 0, key
        assert int(rows[key]["Failure Count"]) == 0, key
    # the repeated prompts were served from the cache
    assert int(rows[("CACHE", "HIT")]["Request Count"]) > 0


def test_ttft_is_found_whatever_whitespace_the_upstream_json_uses(gateway, upstream, tmp_path):
    """An upstream writing ``"content": "`` (Python's json.dumps) still gives TTFT and TBT."""

    async def spaced(req, writer):
        if not json.loads(req.body).get("stream"):  # chat JSON and embeddings: a plain answer
            answer = {"choices": [{"index": 0, "message": {}}], "data": [{"embedding": [0]}]}
            writer.write(http_response(200, json.dumps(answer).encode()))
            return True
        writer.write(sse_head())
        for word in ["Hel", "lo", "!"]:
            event = {"choices": [{"index": 0, "delta": {"content": word}}]}
            writer.write(chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
            await writer.drain()
        writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
        return True

    up = upstream(spaced)
    gw = gateway(config_for(up.url, extra='[logging]\naccess_log = "off"\n'))
    rows = run_locust(gw.url, tmp_path, 3)
    streams = int(rows[("POST", "chat stream")]["Request Count"])
    assert streams > 0 and int(rows[("POST", "chat stream")]["Failure Count"]) == 0
    assert int(rows[("TTFT", "chat stream")]["Request Count"]) == streams
    assert int(rows[("TBT", "chat stream")]["Request Count"]) == 2 * streams
