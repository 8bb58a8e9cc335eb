"""Realtime sessions end to end over real sockets: the official openai SDK's
``client.realtime.connect()`` → the gateway (its own server stack) → an independent realtime
upstream (``websockets``' server), or the embedded default's mock backend."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import orjson

from gateway.config import load_config
from tests.support import config_for


async def sdk_turn(base_url: str, model: str, prompt: str = "hello there", **kw: Any) -> dict:
    """One text turn through the SDK: the deltas joined, the response.done event, all types."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=kw.pop("api_key", "sk-client"))
    types: list[str] = []
    deltas: list[str] = []
    done = None
    async with client.realtime.connect(model=model, **kw) as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": prompt}],
            }
        )
        await conn.response.create()
        async for event in conn:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.done":
                done = event
                break
    await client.close()
    return {"text": "".join(deltas), "done": done, "types": types}


def test_sdk_round_trip_through_the_gateway(gateway, realtime_upstream):
    up = realtime_upstream(deltas=3)
    gw = gateway(config_for(up.url))
    got = asyncio.run(asyncio.wait_for(sdk_turn(gw.base_url, "gpt-realtime"), 20))
    assert got["text"] == "w0 w1 w2 "
    assert got["done"].response.usage.input_tokens == 10
    assert got["types"][0] == "session.created"
    (seen,) = up.wait_ended()
    # what the client sent arrived upstream in order, unchanged
    kinds = [orjson.loads(m)["type"] for m in seen.received]
    assert kinds[:3] == ["session.update", "conversation.item.create", "response.create"]
    assert seen.path.startswith("/v1/realtime?") and "model=gpt-realtime" in seen.path


def test_embedded_default_answers_realtime_through_the_sdk(gateway):
    """The embedded default (mock:// backend, no server) speaks the Realtime API."""
    gw = gateway(load_config())
    got = asyncio.run(asyncio.wait_for(sdk_turn(gw.base_url, "gpt-4o", "tell me more"), 20))
    assert got["text"]
    assert got["types"][0] == "session.created"
    assert "response.created" in got["types"]
    usage = got["done"].response.usage
    assert usage.output_tokens == len(got["text"].split())
    assert usage.input_tokens == 3


def test_mock_upstream_server_speaks_realtime_through_the_gateway(gateway, mock_upstream):
    """``gateway mock-upstream`` (a real server) serves /v1/realtime over WebSocket; its
    ``mock-status-NNN`` models refuse the handshake, and that status reaches the client."""
    gw = gateway(config_for(mock_upstream.url + "/v1"))
    got = asyncio.run(asyncio.wait_for(sdk_turn(gw.base_url, "gpt-4o", "one two"), 20))
    assert got["text"] and got["done"].response.status == "completed"
    assert got["done"].response.usage.input_tokens == 2

    async def refused() -> int:
        client = openai.AsyncOpenAI(base_url=gw.base_url, api_key="sk-client")
        try:
            async with client.realtime.connect(model="mock-status-404") as conn:
                await conn.recv()
        except Exception as exc:  # the SDK surfaces websockets' InvalidStatus
            return int(exc.response.status_code)  # type: ignore[attr-defined]
        finally:
            await client.close()
        return 101

    assert asyncio.run(asyncio.wait_for(refused(), 20)) == 404
