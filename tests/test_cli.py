"""The command line (SPEC §3), run as real processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import urllib.request
import venv
from pathlib import Path

import pytest

from tests.support import Process, answering, free_port, gateway_cli, openai_client

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gateway_cli(*args),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_hash_key_prints_sha256_hex():
    out = run_cli("hash-key", "sk-team-a")
    assert out.returncode == 0
    assert out.stdout.strip() == hashlib.sha256(b"sk-team-a").hexdigest()


def test_check_config_valid_examples_and_default():
    for path in [
        ROOT / "config" / "gateway.toml",
        *sorted((ROOT / "config" / "examples").glob("*.toml")),
    ]:
        out = run_cli("check-config", str(path))
        assert out.returncode == 0, (path, out.stdout, out.stderr)
        assert "valid" in out.stdout


def test_check_config_reports_every_error_with_its_key_path(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        """
[server]
port = "eighty"
colour = "blue"

[[backends]]
name = "a"
url = "ftp://nowhere"
read_timeout_s = -1

[[routes]]
models = ["*"]
backends = ["missing"]

[logging]
access_log = "sometimes"
"""
    )
    out = run_cli("check-config", str(bad))
    assert out.returncode == 2
    lines = out.stdout.strip().splitlines()
    for expected in (
        "server.port: expected an integer",
        "server.colour: unknown key",
        "backends[0].url: scheme must be http, https or mock",
        "backends[0].read_timeout_s: must be > 0",
        "routes[0].backends[0]: no backend named 'missing'",
        "logging.access_log: must be one of",
    ):
        assert any(line.startswith(expected) for line in lines), (expected, lines)


def test_check_config_env_overrides_are_checked_too(tmp_path):
    good = ROOT / "config" / "gateway.toml"
    out = run_cli("check-config", str(good), env={"GATEWAY__SERVER__WORKERS": "zero"})
    assert out.returncode == 2
    assert out.stdout.startswith("server.workers: expected a number")


def test_check_config_unreadable_and_invalid_toml(tmp_path):
    out = run_cli("check-config", str(tmp_path / "nope.toml"))
    assert out.returncode == 2 and "cannot read" in out.stdout
    broken = tmp_path / "broken.toml"
    broken.write_text("[server\nport = 1")
    out = run_cli("check-config", str(broken))
    assert out.returncode == 2 and "invalid TOML" in out.stdout


def test_serve_embedded_default_with_env_port_override(tmp_path):
    port = free_port()
    env = {"GATEWAY__SERVER__PORT": str(port)}
    env.pop("GATEWAY_CONFIG", None)
    proc = Process(gateway_cli("serve"), port, env=env)
    try:
        client = openai_client(f"{proc.url}/v1", "anything")
        answer = client.chat.completions.create(
            model="any-model-at-all", messages=[{"role": "user", "content": "hello"}]
        )
        assert answer.choices[0].message.content
        with urllib.request.urlopen(f"{proc.url}/readyz", timeout=5) as r:
            ready = json.loads(r.read())
        assert ready["status"] == "ready" and ready["config"] == "<embedded default>"
    finally:
        output = proc.stop()
    # SIGTERM is a graceful drain, not an error: exit status 0 (gateway.server.process; a server
    # that re-raises the signal after the drain ends the process with -15)
    assert "gateway: application shutdown complete" in output
    assert proc.proc.returncode == 0


def test_serve_refuses_a_bad_config_with_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 0\n")
    out = run_cli("serve", "--config", str(bad))
    assert out.returncode == 2
    assert "server.port" in out.stderr


def test_probe_reports_curl_style_timings(upstream):
    answer = answering(b'{"object": "list", "data": []}')

    up = upstream(answer)
    out = run_cli("probe", up.url + "/models")
    assert out.returncode == 0, out.stderr
    assert "status=200" in out.stdout
    values = {}
    for line in out.stdout.splitlines()[1:]:
        name, value = line.split(None, 1)
        values[name] = value
    assert set(values) == {"dns", "connect", "tls", "ttfb", "total"}
    assert values["tls"].strip() == "-"  # plain http
    nums = [float(values[k].split()[0]) for k in ("dns", "connect", "ttfb", "total")]
    assert nums == sorted(nums)  # cumulative, like curl -w
    assert up.requests[0].target == "/v1/models"


def test_probe_unreachable_fails_cleanly():
    port = free_port()
    out = run_cli("probe", f"http://127.0.0.1:{port}/")
    assert out.returncode == 1
    assert out.stderr.strip() == f"probe: connect to 127.0.0.1:{port} failed: Connection refused"


def test_mock_upstream_knobs_shape_the_stream():
    port = free_port()
    proc = Process(
        gateway_cli(
            "mock-upstream", "--port", str(port), "--ttft-ms", "200", "--tokens-per-s", "50"
        ),
        port,
    )
    try:
        import time

        client = openai_client(f"{proc.url}/v1", "x")
        start = time.monotonic()
        stamps = []
        for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True, max_tokens=6
        ):
            if c.choices and c.choices[0].delta.content:
                stamps.append(time.monotonic() - start)
        assert len(stamps) == 6
        # TTFT and pacing are what the knobs say (a behaviour of the mock, not a speed test)
        assert stamps[0] >= 0.2
        assert stamps[-1] - stamps[0] >= 5 / 50 * 0.9
    finally:
        proc.stop()


@pytest.mark.slow
def test_readme_first_command_in_a_fresh_venv_after_a_non_editable_install(tmp_path):
    """The README's first command, for real: fresh venv, `pip install .`, `gateway serve`."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = env_dir / "bin" / "pip"
    subprocess.run(
        [str(pip), "install", "-q", str(ROOT)],
        check=True,
        timeout=600,
        cwd=tmp_path,
        capture_output=True,
    )
    # non-editable: the installed package lives in the venv, not in this checkout
    where = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", "import gateway; print(gateway.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert str(env_dir) in where and str(ROOT) not in where
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY")}
    env["GATEWAY__SERVER__PORT"] = str(port)
    proc = subprocess.Popen(
        [str(env_dir / "bin" / "gateway"), "serve"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        from tests.support import wait_port

        wait_port(port, 20)
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(
                {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = json.loads(r.read())
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
