"""Cross-site WebSocket hijacking (RFC 6455 §10.2, docs/spec.md §25): a browser opens a WebSocket
to any site with its page's ``Origin`` and no preflight, so ``/v1/realtime`` — a session on the
backend's key — checks it before the upgrade. Driven by the official openai SDK (its
``extra_headers`` stand in for the browser's ``Origin``) and by ``websockets``' client."""

from __future__ import annotations

import asyncio

import openai
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.realtime.test_session import sdk_turn
from tests.support import config_for


async def _refused_status(base_url: str, origin: str) -> int:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-client")
    try:
        async with client.realtime.connect(
            model="gpt-realtime", extra_headers={"Origin": origin}
        ) as conn:
            await conn.recv()
    except Exception as exc:  # the SDK surfaces websockets' InvalidStatus
        return int(exc.response.status_code)  # type: ignore[attr-defined]
    finally:
        await client.close()
    return 101


def test_a_foreign_origin_cannot_open_a_realtime_session(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))
    for origin in ("https://evil.example", "null", "http://localhost.evil.example"):
        assert asyncio.run(asyncio.wait_for(_refused_status(gw.base_url, origin), 20)) == 403
    assert up.handshakes == [] and up.sessions == []  # the upstream was never reached


def test_the_refusal_is_an_http_answer_in_the_openai_shape(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))
    url = gw.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"

    async def attempt() -> InvalidStatus:
        try:
            async with connect(url, origin="https://evil.example"):  # type: ignore[arg-type]
                pass
        except InvalidStatus as exc:
            return exc
        raise AssertionError("the upgrade was accepted")

    refused = asyncio.run(asyncio.wait_for(attempt(), 20))
    assert refused.response.status_code == 403
    assert b'"origin_not_allowed"' in refused.response.body
    assert up.handshakes == []


def test_an_allowed_origin_opens_a_session(gateway, realtime_upstream):
    up = realtime_upstream(deltas=2)
    gw = gateway(config_for(up.url, extra='[server]\nallowed_origins = ["https://app.example"]'))
    for origin in ("https://app.example", "http://localhost:5173"):
        got = asyncio.run(
            asyncio.wait_for(
                sdk_turn(gw.base_url, "gpt-realtime", extra_headers={"Origin": origin}), 20
            )
        )
        assert got["text"] == "w0 w1 "
    assert len(up.wait_ended(2)) == 2
