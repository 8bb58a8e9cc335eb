"""The request scope (gateway/scope.py) over a real Runtime, driven with a hand-written
``send``: begin → errors rendered in the OpenAI shape → 499 → finish, exactly once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from gateway.config import load_config
from gateway.errors import ClientGone, NotFound, UpstreamError
from gateway.runtime import Runtime, build_runtime
from gateway.scope import ResponseAborted

CONFIG = """
[[backends]]
name = "mock"
url = "mock://"
[[routes]]
models = ["*"]
backends = ["mock"]
[ui]
enabled = true
[logging]
access_log = "off"
"""


class Sent(list[dict[str, Any]]):
    async def __call__(self, message: dict[str, Any]) -> None:
        self.append(message)


def http_scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"x-request-id", b"scope-test")],
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
    }


@pytest.fixture
def rt() -> Runtime:
    return build_runtime(load_config(text=CONFIG, env={}), environ={})


def finished(rt: Runtime) -> list[dict[str, Any]]:
    assert rt.recent is not None  # the live view's ring is one of the finish sinks
    return [r for r in rt.recent.records() if r["id"] == "scope-test"]


async def body_of(scope_fn: Any) -> tuple[Sent, Any]:
    sent = Sent()
    result = await asyncio.wait_for(scope_fn(sent), 5)
    return sent, result


def test_a_gateway_error_before_the_response_is_rendered_and_finished_once(rt):
    async def go(sent: Sent) -> None:
        async with rt.request(http_scope(), sent):
            raise NotFound("no route for model 'x'", code="model_not_found")

    sent, _ = asyncio.run(body_of(go))
    start, body = sent
    assert start["status"] == 404
    assert (b"x-request-id", b"scope-test") in start["headers"]
    error = orjson.loads(body["body"])["error"]
    assert (error["type"], error["code"]) == ("not_found_error", "model_not_found")
    (record,) = finished(rt)  # telemetry ran exactly once
    assert record["status"] == 404


def test_an_error_after_the_response_started_drops_the_connection(rt):
    async def go(sent: Sent) -> None:
        async with rt.request(http_scope(), sent) as req:
            await req.out.start(200, [(b"content-type", b"text/event-stream")])
            raise UpstreamError("upstream reset mid-stream")

    with pytest.raises(ResponseAborted):
        asyncio.run(body_of(go))
    (record,) = finished(rt)
    assert record["status"] == 200  # what the client got before the drop


def test_a_client_that_went_away_is_counted_as_499(rt):
    async def go(sent: Sent) -> None:
        async with rt.request(http_scope(), sent):
            raise ClientGone()

    sent, _ = asyncio.run(body_of(go))
    assert sent == []
    (record,) = finished(rt)
    assert record["status"] == 499


def test_a_bug_is_a_500_in_the_openai_shape_and_logged(rt, caplog):
    async def go(sent: Sent) -> None:
        async with rt.request(http_scope(), sent):
            raise KeyError("a bug")

    with caplog.at_level(logging.ERROR, logger="gateway"):
        sent, _ = asyncio.run(body_of(go))
    start, body = sent
    assert start["status"] == 500
    assert orjson.loads(body["body"])["error"]["message"] == "internal error in the gateway"
    assert any("scope-test" in r.getMessage() for r in caplog.records)
    assert finished(rt)[0]["status"] == 500
