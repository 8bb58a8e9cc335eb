"""Live config reload (docs/spec.md §29): ``gateway serve`` as its own process, its file
rewritten and SIGHUP (or ``gateway reload``) sent; the openai SDK and locust as clients."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import openai
import pytest

from gateway.app import Gateway
from gateway.config import ConfigError, load_config
from gateway.snapshots import merge
from tests.gateway_process import gateway_process
from tests.model_api_support import metric_lines, metric_value
from tests.support import Process, free_port, gateway_cli, gateway_config, openai_client, until
from tests.test_locustfile import run_locust

MESSAGES = [{"role": "user", "content": "hi"}]
ROUTES = """
[[backends]]
name = "up"
url = "{url}"
read_timeout_s = 120
[[routes]]
models = ["gpt-*", "mock-*"]
backends = ["up"]
"""


def config_of(tmp_path: Path, proc: Process) -> Path:
    return tmp_path / f"gateway-{proc.port}.toml"


def rewrite(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def reloads(proc: Process, result: str) -> float:
    return metric_value(metric_lines(proc.url, "gateway_config_reloads_total"), result=result)


def wait_for(predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.05)


def served(proc: Process, model: str) -> bool:
    client = openai_client(proc.url + "/v1")
    try:
        client.chat.completions.create(model=model, messages=MESSAGES)
    except openai.NotFoundError:
        return False
    return True


def test_a_route_change_takes_effect_for_the_next_request(tmp_path):
    """``gateway reload -c FILE`` finds the gateway by the pid file its config names."""
    pid_file = tmp_path / "gateway.pid"
    body = ROUTES.format(url="mock://")
    with gateway_process(tmp_path, body, server_extra=f'pid_file = "{pid_file}"') as proc:
        path = config_of(tmp_path, proc)
        assert pid_file.read_text() == f"{proc.proc.pid}\n"
        assert served(proc, "gpt-4o") and not served(proc, "claude-sonnet-4")
        rewrite(path, '["gpt-*", "mock-*"]', '["claude-*"]')
        cli = subprocess.run(
            gateway_cli("reload", "-c", str(path)), capture_output=True, text=True, timeout=30
        )
        assert cli.returncode == 0, cli.stderr
        assert f"sent SIGHUP to process {proc.proc.pid}" in cli.stdout
        wait_for(lambda: reloads(proc, "ok") == 1, "the reload")
        assert served(proc, "claude-sonnet-4") and not served(proc, "gpt-4o")
    assert not pid_file.exists()  # removed at exit
    cli = subprocess.run(
        gateway_cli("reload", "-c", str(path), "--pid", str(proc.proc.pid)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cli.returncode == 1 and f"no process {proc.proc.pid}" in cli.stderr


def test_gateway_reload_signals_nothing_for_a_file_that_would_not_load(tmp_path):
    with gateway_process(tmp_path, ROUTES.format(url="mock://")) as proc:
        path = config_of(tmp_path, proc)
        rewrite(path, "read_timeout_s = 120", 'read_timeout_s = "slow"')
        cli = subprocess.run(
            gateway_cli("reload", "-c", str(path), "--pid", str(proc.proc.pid)),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert cli.returncode == 2
        assert "backends[0].read_timeout_s: expected a number" in cli.stderr
        assert reloads(proc, "ok") == reloads(proc, "error") == 0
        assert proc.proc.poll() is None


def test_an_invalid_file_keeps_the_old_config_and_counts_an_error(tmp_path):
    with gateway_process(tmp_path, ROUTES.format(url="mock://")) as proc:
        path = config_of(tmp_path, proc)
        rewrite(path, '["gpt-*", "mock-*"]', '["claude-*"]\nbackends_typo = 1')
        os.kill(proc.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(proc, "error") == 1, "the failed reload")
        path.write_text(path.read_text() + "\n[[routes]\n")  # not even TOML
        os.kill(proc.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(proc, "error") == 2, "the second failed reload")
        assert served(proc, "gpt-4o") and not served(proc, "claude-sonnet-4")
        assert reloads(proc, "ok") == 0
        out = proc.stop()
    lines = [line for line in out.splitlines() if "config reload failed" in line]
    assert len(lines) == 2, out
    assert "routes[0].backends_typo: unknown key" in lines[0]
    assert "invalid TOML" in lines[1]


def test_settings_that_need_a_restart_keep_their_value_with_a_warning(tmp_path):
    body = ROUTES.format(url="mock://") + "[cache]\nttl_s = 600\n"
    with gateway_process(tmp_path, body) as proc:
        path = config_of(tmp_path, proc)
        rewrite(path, f"port = {proc.port}", f"port = {proc.port + 1}")
        rewrite(path, "ttl_s = 600", "ttl_s = 5")
        rewrite(path, '["gpt-*", "mock-*"]', '["claude-*"]')
        os.kill(proc.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(proc, "ok") == 1, "the reload")  # still on the old port
        assert served(proc, "claude-sonnet-4")
        path.write_text(path.read_text() + '\n[auth]\nmode = "keys"\n[[auth.keys]]\n'
                        'tenant = "t"\nsha256 = "' + "ab" * 32 + '"\n')  # fmt: skip
        os.kill(proc.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(proc, "error") == 1, "the refused mode change")
        assert served(proc, "claude-sonnet-4")  # still no key asked for
        out = proc.stop()
    warning = next(line for line in out.splitlines() if "only apply at a restart" in line)
    assert "server.port" in warning and "cache.ttl_s" in warning
    assert "auth.mode: cannot change on a reload ('off' -> 'keys')" in out


def test_a_stream_in_flight_across_a_reload_finishes(tmp_path, mock_upstream):
    """A stream paced by the upstream (40 tokens at 20/s) runs while the backend it came from
    is replaced: it ends whole on the old snapshot, its pool closed after it; the next request
    is served by the new config."""
    body = ROUTES.format(url=mock_upstream.url + "/v1")
    with gateway_process(tmp_path, body) as proc:
        path = config_of(tmp_path, proc)
        client = openai_client(proc.url + "/v1")
        stream = client.chat.completions.create(
            model="gpt-4o",
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-mock-tokens-per-s": "20", "x-mock-output-tokens": "40"},
        )
        chunks = iter(stream)
        words = [next(chunks)]
        rewrite(path, "read_timeout_s = 120", "read_timeout_s = 90")
        rewrite(path, '["gpt-*", "mock-*"]', '["claude-*"]')
        os.kill(proc.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(proc, "ok") == 1, "the reload")
        assert served(proc, "claude-sonnet-4") and not served(proc, "gpt-4o")
        words += list(chunks)
        content = [
            c.choices[0].delta.content for c in words if c.choices and c.choices[0].delta.content
        ]
        assert len(content) == 40
        assert words[-1].choices[0].finish_reason is not None


def test_ten_reloads_under_a_locust_run_lose_no_request(tmp_path, mock_upstream):
    """locust (every user type, streams included) against the gateway while it is reloaded ten
    times, its backend replaced each time (a new pool, the old one closed once idle)."""
    body = ROUTES.format(url=mock_upstream.url + "/v1")
    with gateway_process(tmp_path, body) as proc:
        path = config_of(tmp_path, proc)
        rows: dict = {}
        run = threading.Thread(target=lambda: rows.update(run_locust(proc.url, tmp_path, 12)))
        run.start()
        time.sleep(1.5)
        for i in range(10):
            timeout = 120 + (i + 1) % 2
            rewrite(path, f"read_timeout_s = {120 + i % 2}", f"read_timeout_s = {timeout}")
            os.kill(proc.proc.pid, signal.SIGHUP)
            wait_for(lambda n=i + 1: reloads(proc, "ok") == n, f"reload {i + 1}")
            time.sleep(0.4)
        run.join(60)
        assert not run.is_alive()
        assert reloads(proc, "error") == 0
    assert rows, "locust wrote no stats"
    total = rows[("", "Aggregated")]
    assert int(total["Request Count"]) > 100
    assert int(total["Failure Count"]) == 0
    for key in [("POST", "chat"), ("POST", "chat stream"), ("POST", "embeddings")]:
        assert int(rows[key]["Request Count"]) > 0 and int(rows[key]["Failure Count"]) == 0


def handles_sighup(pid: int) -> bool:
    """Whether the process catches SIGHUP (the kernel's SigCgt mask, /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    return False


def workers_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children]


def test_the_supervisor_passes_sighup_to_every_worker(tmp_path):
    with gateway_process(tmp_path, ROUTES.format(url="mock://"), workers=2) as proc:
        path = config_of(tmp_path, proc)
        # a worker still starting ignores SIGHUP (it reads the file as it starts): wait until
        # both handle it, so that each one's reload is this test's
        wait_for(
            lambda: (
                len(workers_of(proc.proc.pid)) == 2
                and all(handles_sighup(w) for w in workers_of(proc.proc.pid))
            ),
            "both workers serving",
            30,
        )
        rewrite(path, '["gpt-*", "mock-*"]', '["claude-*"]')
        os.kill(proc.proc.pid, signal.SIGHUP)
        # the workers' counters are merged: one reload each
        wait_for(lambda: reloads(proc, "ok") == 2, "both workers' reloads")
        for _ in range(10):  # a new connection each: whichever worker takes it
            assert served(proc, "claude-sonnet-4") and not served(proc, "gpt-4o")


#: ``gateway serve`` with a SIGHUP already pending as it starts: a reload asked before the
#: server handles the signal (the case of a worker that is still starting)
SIGHUP_BEFORE_START = """
import os, signal, sys
from gateway.config import load_config
from gateway.server.process import hold_sighup, serve
hold_sighup()
os.kill(os.getpid(), signal.SIGHUP)
raise SystemExit(serve(load_config(sys.argv[1])))
"""


def test_a_reload_asked_while_the_gateway_starts_is_held_not_lost(tmp_path):
    """SIGHUP is blocked (held), not ignored, until the app has started: the reload asked
    meanwhile runs once, after startup, and the process keeps serving."""
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(f"[server]\nport = {port}\n" + ROUTES.format(url="mock://"))
    proc = Process([sys.executable, "-c", SIGHUP_BEFORE_START, str(config)], port)
    try:
        wait_for(lambda: reloads(proc, "ok") == 1, "the held reload")
        assert served(proc, "gpt-4o")
    finally:
        proc.stop()
    assert proc.proc.returncode == 0, proc.output


BASE = """
[[backends]]
name = "a"
url = "mock://"
[[routes]]
models = ["*"]
backends = ["a"]
"""


def test_merge_applies_the_reloaded_sections_and_names_the_others():
    old = gateway_config(BASE + "[server]\nport = 8080\n[cache]\nttl_s = 600\n")
    new = gateway_config(
        BASE.replace('["*"]', '["gpt-*"]')
        + '[server]\nport = 9090\n[cache]\nttl_s = 5\n[[prices]]\nmodels = ["*"]\n'
        "input = 1.0\noutput = 2.0\n"
    )
    merged, kept = merge(old, new)
    assert merged.routes == new.routes and merged.prices == new.prices
    assert merged.server.port == 8080 and merged.cache.ttl_s == 600
    assert kept == ["server.port", "cache.ttl_s"]
    keyed = gateway_config(
        BASE + '[auth]\nmode = "keys"\n[[auth.keys]]\ntenant = "t"\nsha256 = "' + "cd" * 32 + '"\n'
    )
    with pytest.raises(ConfigError, match=r"auth\.mode: cannot change"):
        merge(old, keyed)
    assert merge(keyed, keyed)[1] == []


def test_an_old_pool_closes_once_its_last_request_ends_and_an_unchanged_one_is_kept(tmp_path):
    """The app's generations (what ``Gateway.__call__`` counts per request): a backend that
    changed gets a new pool, the old one closed only when the old snapshot's requests are
    over; a backend that did not change keeps its pool across reloads."""
    path = tmp_path / "gateway.toml"
    path.write_text(
        '[[backends]]\nname = "up"\nurl = "http://127.0.0.1:9/v1"\nread_timeout_s = 120\n'
        '[[backends]]\nname = "keep"\nurl = "http://127.0.0.1:9/v1"\n'
        '[[routes]]\nmodels = ["*"]\nbackends = ["up", "keep"]\n'
    )

    async def run() -> None:
        app = Gateway(load_config(path))
        async with app.running():
            first = app.snapshots.current
            assert first is not None
            changed, kept = first.runtime.backends["up"], first.runtime.backends["keep"]
            first.active += 1  # a request in flight on the first snapshot
            rewrite(path, "read_timeout_s = 120", "read_timeout_s = 60")
            assert await app.reload()
            now = app.runtime
            assert now is not None and now.backends["up"] is not changed
            assert now.backends["keep"] is kept
            await asyncio.sleep(0.05)
            assert not changed.transport._closed  # its request still runs
            first.active -= 1
            app.snapshots.idle(first)  # as the request's end does
            await until(lambda: changed.transport._closed, "the old pool closed")
            assert not kept.transport._closed

    asyncio.run(run())


def test_an_mcp_server_and_an_agent_added_by_a_reload_are_served(tmp_path):
    """``[[mcp_servers]]`` and ``[[agents]]`` follow a reload: their paths are in the new
    snapshot's table, served by clients made for that snapshot."""
    card = "/a2a/echo/.well-known/agent-card.json"
    with gateway_process(tmp_path, ROUTES.format(url="mock://")) as proc:
        path = config_of(tmp_path, proc)
        assert httpx2.get(proc.url + card, timeout=10).status_code == 404
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        headers = {"accept": "application/json, text/event-stream"}
        assert httpx2.post(proc.url + "/mcp/tools", json=ping, headers=headers).status_code == 404
        path.write_text(
            path.read_text()
            + '\n[[agents]]\nname = "echo"\nurl = "mock://"\n'
            + '[[mcp_servers]]\nname = "tools"\nurl = "mock://"\n'
        )
        os.kill(proc.proc.pid, signal.SIGHUP)
        wait_for(lambda: reloads(proc, "ok") == 1, "the reload")
        answer = httpx2.get(proc.url + card, timeout=10)
        assert answer.status_code == 200 and answer.json()["name"]
        answer = httpx2.post(proc.url + "/mcp/tools", json=ping, headers=headers, timeout=10)
        assert answer.status_code == 200, answer.text
