"""The relay (docs/spec.md §19): unbatched, in order, both kinds of message, close codes both
ways, 1011 on a lost upstream, the upstream closed when the client vanishes, the limits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.realtime.test_handshake import run, ws_url
from tests.support import config_for

CREATE = orjson.dumps({"type": "response.create"}).decode()


async def closed_with(ws: Any) -> tuple[int | None, str | None]:
    """Read until the gateway closes the session: its close code and reason."""
    with pytest.raises(ConnectionClosed):
        while True:
            await ws.recv()
    rcvd = ws.protocol.close_rcvd
    return (rcvd.code, rcvd.reason) if rcvd is not None else (None, None)


def test_paced_deltas_reach_the_client_as_paced_not_batched(gateway, realtime_upstream):
    """Each delta arrives before the upstream has even begun to send the next one."""
    up = realtime_upstream(deltas=5, pace_s=0.15)
    gw = gateway(config_for(up.url))

    async def main() -> list[float]:
        arrived = []
        async with connect(ws_url(gw), open_timeout=10) as ws:
            await ws.recv()  # session.created
            await ws.send(CREATE)
            while True:
                event = orjson.loads(await ws.recv())
                if event["type"] == "response.output_text.delta":
                    arrived.append(time.perf_counter())
                elif event["type"] == "response.done":
                    return arrived

    arrived = run(main())
    (seen,) = up.wait_ended()
    assert len(arrived) == len(seen.sent_at) == 5
    for i in range(4):  # the upstream stamps each delta right before sending it
        assert arrived[i] < seen.sent_at[i + 1], f"delta {i} was held back"


def test_text_and_binary_both_ways_in_order(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))
    sent: list[str | bytes] = [
        f'{{"type":"x.{i}"}}' if i % 2 else bytes([i]) * 70_000 for i in range(20)
    ]

    async def main() -> list[str | bytes]:
        async with connect(ws_url(gw, "echo"), open_timeout=10, max_size=None) as ws:
            await ws.recv()
            for message in sent:
                await ws.send(message)
            return [await ws.recv() for _ in sent]

    assert run(main()) == sent
    (seen,) = up.wait_ended()
    assert seen.received == sent


def test_close_codes_and_reasons_pass_through_both_ways(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))

    async def main() -> tuple[int | None, str | None]:
        async with connect(ws_url(gw), open_timeout=10) as ws:  # the client closes: 4001
            await ws.recv()
            await ws.close(4001, "client says bye")
        async with connect(ws_url(gw, "close-4002"), open_timeout=10) as ws:  # the upstream
            await ws.recv()
            await ws.send("{}")
            return await closed_with(ws)

    assert run(main()) == (4002, "upstream says bye")
    first, _ = up.wait_ended(2)
    assert first.close == (4001, "client says bye")


def test_an_upstream_lost_without_a_close_is_1011_for_the_client(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))

    async def main() -> tuple[int | None, str | None]:
        async with connect(ws_url(gw, "drop"), open_timeout=10) as ws:
            await ws.recv()
            await ws.send("{}")
            return await closed_with(ws)

    code, _reason = run(main())
    assert code == 1011


def test_a_client_that_vanishes_gets_its_upstream_closed(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))

    async def main() -> float:
        ws = await connect(ws_url(gw), open_timeout=10)
        await ws.recv()
        ws.transport.abort()  # no close frame: the TCP connection is simply gone
        gone = time.perf_counter()
        await ws.wait_closed()
        return gone

    gone = run(main())
    (seen,) = up.wait_ended(timeout=10)
    assert seen.close is not None and seen.close[0] == 1001  # going away, said by the gateway
    assert seen.ended_at is not None and seen.ended_at > gone


def limited(url: str, **limits: Any) -> Any:
    keys = "\n".join(f"{k} = {v}" for k, v in limits.items())
    return config_for(url, extra=f"[realtime]\n{keys}")


def test_a_client_message_over_max_message_bytes_closes_1009(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(limited(up.url, max_message_bytes=1024))

    async def main() -> tuple[int | None, str | None]:
        async with connect(ws_url(gw, "echo"), open_timeout=10) as ws:
            await ws.recv()
            await ws.send("y" * 1000)  # under the limit: relayed
            assert await ws.recv() == "y" * 1000
            await ws.send("z" * 2000)
            return await closed_with(ws)

    code, _ = run(main())
    assert code == 1009
    (seen,) = up.wait_ended()
    assert seen.received == ["y" * 1000]  # the big one never went upstream


def test_an_upstream_message_over_max_message_bytes_closes_1009(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(limited(up.url, max_message_bytes=1024))

    async def main() -> tuple[int | None, str | None]:
        async with connect(ws_url(gw, "big-5000"), open_timeout=10) as ws:
            await ws.recv()
            await ws.send("{}")
            return await closed_with(ws)

    code, _ = run(main())
    assert code == 1009


def test_an_idle_session_is_closed_1000_idle_timeout(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(limited(up.url, idle_timeout_s=0.3))

    async def main() -> tuple[int | None, str | None]:
        async with connect(ws_url(gw), open_timeout=10) as ws:
            await ws.recv()
            return await closed_with(ws)

    assert run(main()) == (1000, "idle timeout")
    (seen,) = up.wait_ended()
    assert seen.close == (1000, "idle timeout")


def test_a_session_past_max_session_s_is_closed_1000(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(limited(up.url, max_session_s=0.4, idle_timeout_s=30))

    async def main() -> tuple[int | None, str | None]:
        async with connect(ws_url(gw, "echo"), open_timeout=10) as ws:
            await ws.recv()

            async def chatter() -> None:  # never idle
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        await ws.send('{"type":"ping.app"}')
                        await asyncio.sleep(0.05)

            task = asyncio.create_task(chatter())
            try:
                return await closed_with(ws)
            finally:
                task.cancel()

    assert run(main()) == (1000, "session time limit")
