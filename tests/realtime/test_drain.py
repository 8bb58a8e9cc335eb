"""SIGTERM with realtime sessions open (docs/spec.md §13, §19): a drain, as for streams. A session
with a model response in progress keeps relaying until that response is done, then gets close
1012 ("service restart": the client reconnects, to another replica); an idle session gets it at
once; a response that outlasts ``shutdown_grace_s`` is closed with 1012 before the grace is over
— never a connection simply dropped (1006). The upstream is closed too, and the process exits 0.
The gateway runs as ``python -m gateway.cli serve`` and gets a real SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.gateway_process import backend_toml, gateway_process
from tests.realtime.test_handshake import run
from tests.realtime_support import RealtimeUpstream

ROUTE = '[[routes]]\nmodels = ["*"]\nbackends = ["up"]\n'


def _config(up: RealtimeUpstream) -> str:
    return backend_toml("up", up.url, 'api_key_env = "TEST_BACKEND_KEY"') + ROUTE


async def _session(port: int, signal_it: Callable[[], None], respond: bool) -> dict[str, Any]:
    """One session: (a response asked for and its first delta read, or nothing), then SIGTERM;
    what the client read afterwards and how it was closed."""
    kinds: list[str] = []
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=m", open_timeout=10) as ws:
        await ws.recv()  # session.created
        if respond:
            await ws.send('{"type":"response.create"}')
            while orjson.loads(await ws.recv())["type"] != "response.output_text.delta":
                pass
        signalled = time.monotonic()
        signal_it()
        try:
            while True:
                kinds.append(orjson.loads(await ws.recv())["type"])
        except ConnectionClosed:
            pass
        closed_after = time.monotonic() - signalled
        rcvd = ws.protocol.close_rcvd
    return {
        "kinds": kinds,
        "code": rcvd.code if rcvd is not None else None,
        "reason": rcvd.reason if rcvd is not None else None,
        "closed_after": closed_after,
    }


def _drain(tmp_path: Path, up: RealtimeUpstream, grace: float, respond: bool) -> dict[str, Any]:
    with gateway_process(tmp_path, _config(up), server_extra=f"shutdown_grace_s = {grace}") as gw:
        got = run(
            _session(gw.port, lambda: gw.proc.send_signal(signal.SIGTERM), respond), timeout=60
        )
        got["exit"] = gw.proc.wait(30)
    (seen,) = up.wait_ended()
    got["upstream_close"] = seen.close
    return got


def test_sigterm_lets_the_response_in_progress_finish_then_closes_1012(tmp_path, realtime_upstream):
    up = realtime_upstream(deltas=5, pace_s=0.3)  # ~1.2 s of deltas after the first
    got = _drain(tmp_path, up, grace=20, respond=True)
    # every delta left of the response, and its end, reached the client before the close
    assert got["kinds"] == ["response.output_text.delta"] * 4 + ["response.done"]
    assert (got["code"], got["reason"]) == (1012, "service restart")
    assert got["upstream_close"] is not None and got["upstream_close"][0] == 1012
    assert got["exit"] == 0


def test_sigterm_closes_an_idle_session_at_once_with_1012(tmp_path, realtime_upstream):
    up = realtime_upstream()
    got = _drain(tmp_path, up, grace=20, respond=False)
    assert got["kinds"] == []
    assert (got["code"], got["reason"]) == (1012, "service restart")
    assert got["closed_after"] < 10  # not held for the grace (generous: a behaviour)
    assert got["exit"] == 0


def test_a_response_longer_than_the_grace_is_closed_1012_within_it(tmp_path, realtime_upstream):
    up = realtime_upstream(deltas=30, pace_s=0.5)  # ~15 s: longer than the grace
    got = _drain(tmp_path, up, grace=3, respond=True)
    assert "response.done" not in got["kinds"]
    # relayed on after the signal, until a second before the grace was over
    assert got["kinds"].count("response.output_text.delta") >= 2
    assert got["closed_after"] >= 3 - 1 - 0.5
    assert got["code"] == 1012  # a close frame, not a dropped connection
    assert got["exit"] == 0


def test_a_refused_response_create_does_not_hold_the_drain(tmp_path, realtime_upstream):
    """A response.create the upstream refused (an error event, no response) leaves nothing in
    progress: the session closes at once, not when the grace is nearly over."""
    up = realtime_upstream()

    async def session(port: int, signal_it: Callable[[], None]) -> tuple[int | None, float]:
        url = f"ws://127.0.0.1:{port}/v1/realtime?model=busy"
        async with connect(url, open_timeout=10) as ws:
            await ws.recv()
            await ws.send('{"type":"response.create"}')
            assert orjson.loads(await ws.recv())["type"] == "error"
            signalled = time.monotonic()
            signal_it()
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
            rcvd = ws.protocol.close_rcvd
        return (rcvd.code if rcvd is not None else None), time.monotonic() - signalled

    with gateway_process(tmp_path, _config(up), server_extra="shutdown_grace_s = 30") as gw:
        code, closed_after = run(
            session(gw.port, lambda: gw.proc.send_signal(signal.SIGTERM)), timeout=60
        )
        assert gw.proc.wait(30) == 0
    assert code == 1012
    assert closed_after < 15  # held for the grace it would be 29 s (generous: a behaviour)


def test_the_process_stops_accepting_sessions_once_draining(tmp_path, realtime_upstream):
    up = realtime_upstream(deltas=40, pace_s=0.25)  # ~10 s of response after the signal
    with gateway_process(tmp_path, _config(up), server_extra="shutdown_grace_s = 20") as gw:

        async def main() -> None:
            url = f"ws://127.0.0.1:{gw.port}/v1/realtime?model=m"
            async with connect(url, open_timeout=10) as ws:
                await ws.recv()
                await ws.send('{"type":"response.create"}')
                await ws.recv()
                gw.proc.send_signal(signal.SIGTERM)
                # the listener closes once the server sees the signal: a new session is
                # refused from then on, while the first one is still relaying
                deadline = time.monotonic() + 8
                while True:
                    try:
                        async with connect(url, open_timeout=3) as late:
                            await late.recv()
                    except (OSError, TimeoutError):
                        break
                    except ConnectionClosed:
                        pass  # accepted before the listener closed: drained at once
                    assert time.monotonic() < deadline, "still accepting sessions"
                    await asyncio.sleep(0.1)
                assert ws.protocol.close_rcvd is None  # the first session still relays
                with contextlib.suppress(ConnectionClosed):  # 1012 once the response is done
                    async for _ in ws:
                        pass

        run(main(), timeout=60)
        assert gw.proc.wait(30) == 0
