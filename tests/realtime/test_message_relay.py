"""The relay (docs/spec.md §19): unbatched, in order, both kinds of message, close codes both
ways, 1011 on a lost upstream, the upstream closed when the client vanishes, the limits, a slow
reader slowing its sender (both ways, in order across the direct path and the queue), invalid
UTF-8 never relayed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
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


def test_the_relay_takes_the_direct_path_the_server_protocol_offers(gateway, realtime_upstream):
    """The server's protocol offers its end in ``websocket.connect`` and the relay registers
    its direct path there (issue 32): were the offer lost, the pumps would still relay every
    message, only slower — so the test looks at the open session itself."""
    up = realtime_upstream()
    gw = gateway(config_for(up.url))
    assert gw.app.runtime is not None
    sessions = gw.app.runtime.sessions

    async def main() -> list[bool]:
        async with connect(ws_url(gw, "echo"), open_timeout=10) as ws:
            await ws.recv()
            await ws.send('{"type":"x"}')
            assert await ws.recv() == '{"type":"x"}'
            return [s.relay is not None and s.relay.direct for s in list(sessions.values())]

    assert run(main()) == [True]
    up.wait_ended()


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


def test_fragmented_client_messages_reach_the_upstream_whole_and_in_order(
    gateway, realtime_upstream
):
    """A message the client sends in fragments is offered to the relay once, whole (the direct
    path takes whole one-frame messages from the frame, fragmented ones once reassembled)."""
    up = realtime_upstream()
    gw = gateway(config_for(up.url))
    sent: list[str | bytes] = [
        f'{{"type":"x.{i}","pad":"{"é" * 40}"}}' if i % 2 else bytes([i]) * 3_000 for i in range(12)
    ]

    async def main() -> list[str | bytes]:
        async with connect(ws_url(gw, "echo"), open_timeout=10, max_size=None) as ws:
            await ws.recv()
            for i, message in enumerate(sent):
                if i % 3:  # two of three in three fragments (a text one cut between characters)
                    cut = len(message) // 3
                    await ws.send([message[:cut], message[cut : 2 * cut], message[2 * cut :]])
                else:
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


# ---------------------------------------------------------------- back-pressure (docs/spec.md §19)


def settled(progress: Any, limit: int, timeout: float = 30.0) -> int:
    """``progress()`` once it stops moving short of ``limit`` (the sender waits for its reader)
    or reaches it; bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    last, still = -1, 0
    while time.monotonic() < deadline:
        now = progress()
        if now >= limit:
            return int(now)
        still = still + 1 if now == last and now else 0
        if still >= 10:  # half a second without a message sent (once the first one went)
            return int(now)
        last = now
        time.sleep(0.05)
    return int(progress())


async def small_socket(port: int, option: int) -> socket.socket:
    """A connected client socket with a small kernel buffer (``SO_RCVBUF`` / ``SO_SNDBUF``)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, option, 1 << 18)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


FLOOD, SIZE = 64, 1 << 20


def test_a_slow_client_slows_the_upstream_and_gets_every_message_in_order(
    gateway, realtime_upstream
):
    """The upstream floods 64 MiB at a client that reads nothing: the gateway stops reading the
    upstream instead of buffering (its sends wait), then everything arrives, in order."""
    up = realtime_upstream()
    gw = gateway(config_for(up.url))

    async def main() -> tuple[int, bool, list[int]]:
        sock = await small_socket(gw.port, socket.SO_RCVBUF)
        url = ws_url(gw, f"flood-{FLOOD}-{SIZE}")
        async with connect(url, sock=sock, open_timeout=10, max_size=None, max_queue=1) as ws:
            await ws.recv()  # session.created
            await ws.send("{}")  # the flood starts

            def sent() -> int:
                return len(up.sessions[0].sent_at) if up.sessions else 0

            held = await asyncio.to_thread(settled, sent, FLOOD)
            blocked = up.sessions[0].blocked
            got = []
            for _ in range(FLOOD):
                message = await ws.recv()
                assert len(message) == SIZE
                got.append(int.from_bytes(message[:4], "big"))
            return held, blocked, got

    held, blocked, got = run(main(), timeout=90)
    assert held < FLOOD and blocked, f"the upstream sent {held} of {FLOOD} MiB unread"
    assert got == list(range(FLOOD))


def test_a_slow_upstream_slows_the_client_and_gets_every_message_in_order(
    gateway, realtime_upstream
):
    """The client pushes 64 MiB to an upstream that reads nothing: the gateway stops reading the
    client (its sends wait), then everything arrives upstream, in order."""
    up = realtime_upstream()
    gw = gateway(config_for(up.url))
    filler = b"c" * (SIZE - 4)

    async def main() -> int:
        sock = await small_socket(gw.port, socket.SO_SNDBUF)
        async with connect(ws_url(gw, "stall"), sock=sock, open_timeout=10, max_size=None) as ws:
            await ws.recv()  # session.created
            sent = 0

            async def push() -> None:
                nonlocal sent
                for i in range(FLOOD):
                    await ws.send(i.to_bytes(4, "big") + filler)
                    sent += 1

            task = asyncio.create_task(push())
            held = await asyncio.to_thread(settled, lambda: sent, FLOOD)
            up.release()
            await task
            return held

    held = run(main(), timeout=90)
    assert held < FLOOD, f"the client sent {held} of {FLOOD} MiB unread"
    (seen,) = up.wait_ended(timeout=30)
    assert [int.from_bytes(m[:4], "big") for m in seen.received] == list(range(FLOOD))


def test_text_that_is_not_utf8_closes_1007_either_way(gateway, realtime_upstream):
    """Invalid UTF-8 is never relayed: the side that got it fails its hop with 1007, as a
    WebSocket endpoint must, and the other side gets the same code."""
    up = realtime_upstream()
    gw = gateway(config_for(up.url))

    async def main() -> tuple[tuple[int | None, str | None], tuple[int | None, str | None]]:
        async with connect(ws_url(gw, "echo"), open_timeout=10) as ws:  # the client's
            await ws.recv()
            await ws.send('{"type":"fine"}')
            assert await ws.recv() == '{"type":"fine"}'
            await ws.send(b"\xff\xfe not UTF-8", text=True)
            from_client = await closed_with(ws)
        async with connect(ws_url(gw, "badtext"), open_timeout=10) as ws:  # the upstream's
            await ws.recv()
            await ws.send("{}")
            return from_client, await closed_with(ws)

    from_client, from_upstream = run(main())
    assert from_client[0] == 1007 and from_upstream[0] == 1007
    first, _ = up.wait_ended(2)
    assert first.received == ['{"type":"fine"}']  # the bad one never went upstream
    assert first.close is not None and first.close[0] == 1007
