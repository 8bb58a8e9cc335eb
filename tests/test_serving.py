"""gateway/server/process.py, supervisor.py, worker.py: the process around the HTTP/1.1
protocol, on real processes and sockets — SIGINT drains then ends the process by SIGINT, a
failed startup is exit status 3 (with one process and with workers), ``--workers 2`` serves,
replaces a worker that died, and its workers end when the supervisor is killed outright; the
lifespan protocol and the ``date`` header. (The SIGTERM drain with one and two workers:
tests/test_drain.py.)"""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import subprocess
import sys
import textwrap
import time
from email.utils import parsedate_to_datetime
from typing import Any

from gateway.server.process import STARTUP_FAILURE, Lifespan
from gateway.server.state import ServerState
from tests.gateway_process import backend_toml, gateway_process
from tests.support import WORDS, config_for, free_port, paced_upstream
from tests.test_drain import ROUTE, children, open_stream, refuses_connections, running


def wait_for(check: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {timeout} s"
        time.sleep(0.05)


def get(port: int, path: str = "/healthz") -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


def test_sigint_drains_the_stream_then_ends_the_process_by_sigint(tmp_path, upstream):
    up = upstream(paced_upstream([], gap=0.2))
    config = backend_toml("up", up.url) + ROUTE
    with gateway_process(tmp_path, config, server_extra="shutdown_grace_s = 20") as gw:
        conn, resp, first = open_stream(gw.port)
        gw.proc.send_signal(signal.SIGINT)
        wait_for(lambda: refuses_connections(gw.port), "refusing connections")
        body = first + resp.read()
        conn.close()
        assert gw.proc.wait(30) == -signal.SIGINT  # the shell's convention for Ctrl+C
    assert body.count(b"data: {") == len(WORDS) + 1
    assert "Traceback" not in gw.output, gw.output


def test_two_workers_serve_and_a_worker_that_dies_is_replaced(tmp_path, upstream):
    up = upstream(paced_upstream([], gap=0.01))
    with gateway_process(tmp_path, backend_toml("up", up.url) + ROUTE, workers=2) as gw:
        wait_for(lambda: len(children(gw.proc.pid)) == 2, "two workers")
        first, second = children(gw.proc.pid)
        assert get(gw.port).status == 200
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: first not in children(gw.proc.pid), "the killed worker reaped")
        wait_for(lambda: len(children(gw.proc.pid)) == 2, "a worker started in its place")
        assert second in children(gw.proc.pid)
        for _ in range(10):  # whichever worker takes it, it is served
            assert get(gw.port).status == 200
        workers = children(gw.proc.pid)
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(30) == 0
        assert not [pid for pid in workers if running(pid)]
    assert "starting another" in gw.output


def test_sigint_to_the_supervisor_drains_the_workers_streams_and_exits_0(tmp_path, upstream):
    up = upstream(paced_upstream([], gap=0.2))
    config = backend_toml("up", up.url) + ROUTE
    with gateway_process(tmp_path, config, workers=2, server_extra="shutdown_grace_s = 20") as gw:
        conn, resp, first = open_stream(gw.port)
        workers = children(gw.proc.pid)
        gw.proc.send_signal(signal.SIGINT)  # the parent only (a terminal's Ctrl+C: all of them)
        wait_for(lambda: refuses_connections(gw.port), "refusing connections")
        body = first + resp.read()
        conn.close()
        assert gw.proc.wait(30) == 0
        assert not [pid for pid in workers if running(pid)]
    assert body.count(b"data: {") == len(WORDS) + 1


def test_the_workers_end_when_the_supervisor_is_killed_outright(tmp_path, upstream):
    up = upstream(paced_upstream([], gap=0.01))
    with gateway_process(tmp_path, backend_toml("up", up.url) + ROUTE, workers=2) as gw:
        wait_for(lambda: len(children(gw.proc.pid)) == 2, "two workers")
        workers = children(gw.proc.pid)
        gw.proc.kill()
        gw.proc.wait(10)
        # each sees the supervisor's pipe close and drains (nothing in flight: at once)
        wait_for(lambda: not any(running(pid) for pid in workers), "the workers gone")
        assert refuses_connections(gw.port)


def _run_script(source: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_a_failed_startup_exits_3_and_never_listens():
    port = free_port()
    out = _run_script(
        f"""
        import socket, sys
        from gateway.server.process import Server, bind
        from gateway.server.state import ServerState

        async def app(scope, receive, send):
            assert scope["type"] == "lifespan"
            await receive()
            await send({{"type": "lifespan.startup.failed", "message": "no database"}})

        sock = bind("127.0.0.1", {port})
        status = Server(ServerState(app), sock, 1.0).run()
        try:
            socket.create_connection(("127.0.0.1", {port}), 1).close()
            print("listening")
        except OSError:
            print("refused")
        sys.exit(status)
        """
    )
    assert out.returncode == STARTUP_FAILURE, out
    assert out.stdout.strip() == "refused"
    assert "lifespan.startup.failed: no database" in out.stderr
    assert "application startup failed" in out.stderr


def test_a_worker_that_cannot_start_stops_the_supervisor_with_exit_3(tmp_path):
    # the workers load the config again (as gateway serve left it in the environment): here it
    # is gone by then, so each worker fails to start
    broken = tmp_path / "gone.toml"
    out = _run_script(
        """
        import sys
        from gateway.server.process import bind
        from gateway.server.supervisor import Supervisor

        with bind("127.0.0.1", 0) as sock:
            sys.exit(Supervisor(sock, 2).run())
        """,
        env={"GATEWAY_CONFIG": str(broken)},
    )
    assert out.returncode == STARTUP_FAILURE, out
    assert "could not start; stopping" in out.stderr
    assert "starting another" not in out.stderr


def test_the_lifespan_protocol_runs_with_the_state_dict():
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "lifespan.startup":
                scope["state"]["pool"] = "open"
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def unsupported(scope: dict[str, Any], receive: Any, send: Any) -> None:
        return None

    async def raising(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    async def scenario() -> tuple[bool, bool, bool, dict[str, Any]]:
        state: dict[str, Any] = {}
        lifespan = Lifespan(app, state)
        ok = await lifespan.startup()
        await lifespan.shutdown()
        plain = await Lifespan(unsupported, {}).startup()
        broken = await Lifespan(raising, {}).startup()
        return ok, plain, broken, state

    ok, plain, broken, state = asyncio.run(scenario())
    assert (ok, plain, broken) == (True, True, False)
    assert state == {"pool": "open"}
    assert seen == ["lifespan.startup", "lifespan.shutdown"]


def test_every_answer_carries_a_current_date_header(gateway):
    gw = gateway(config_for("http://127.0.0.1:9/v1"))
    stamps = []
    for _ in range(2):
        resp = get(gw.port)
        date = resp.getheader("date")
        assert date is not None
        stamps.append(parsedate_to_datetime(date).timestamp())
        time.sleep(1.5)
    assert abs(stamps[0] - time.time()) < 5
    assert stamps[1] > stamps[0]  # set again each second, not frozen at startup
    assert isinstance(gw.server.state, ServerState)
