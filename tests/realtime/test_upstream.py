"""The upstream socket's direct path (gateway/realtime/upstream.py), over a real connection to an
independent upstream: each message is offered to the relay in the read that completed it, and
never ahead of one that went to ``recv()`` before it and is not written yet."""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import connect

from gateway.realtime.upstream import WebSocketsSocket, _StampedConnection
from tests.realtime.test_handshake import run


def test_messages_are_offered_as_read_but_never_ahead_of_one_queued_before(realtime_upstream):
    up = realtime_upstream()

    async def main() -> None:
        ws = await connect(
            f"ws://127.0.0.1:{up.port}/v1/realtime?model=echo",
            create_connection=_StampedConnection,
            open_timeout=10,
        )
        sock = WebSocketsSocket(ws)
        assert '"session.created"' in str(await sock.recv())  # before any relay: recv()
        sock.relayed()
        taken: list[tuple[bytes, bool]] = []
        offered = asyncio.Event()
        accept = False

        def relay(data: bytes, text: bool, read_at: float) -> bool:
            assert read_at > 0
            if accept:
                taken.append((data, text))
                offered.set()
            return accept

        sock.attach(relay)
        await ws.send('{"type":"a"}')  # echoed; the relay declines it: recv() has it
        assert await sock.recv() == '{"type":"a"}'
        accept = True  # from now on the relay takes what it is offered, but "a" is not written
        await ws.send(b"b")
        assert await asyncio.wait_for(sock.recv(), 5) == b"b"  # behind "a", not to the relay
        assert taken == []
        sock.relayed()
        sock.relayed()  # both written: the next one is offered again
        await ws.send('{"type":"c"}')
        await asyncio.wait_for(offered.wait(), 10)
        assert taken == [(b'{"type":"c"}', True)]
        offered.clear()
        await ws.send(b"d")
        await asyncio.wait_for(offered.wait(), 10)
        assert taken[1] == (b"d", False)
        sock.attach(None)
        await sock.close(1000, "")

    run(main())
