"""The response writer (gateway/writer.py), driven with a hand-written ``send``: the one place
that sends to the client adds what every answer carries and stamps the Timeline."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.context import RequestContext, Timeline
from gateway.errors import InvalidRequest, RateLimited
from gateway.writer import ResponseWriter


def context() -> RequestContext:
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    ctx = RequestContext(scope, Timeline())
    ctx.response_headers.append((b"x-request-id", b"req-1"))
    return ctx


class Sent(list[dict[str, Any]]):
    async def __call__(self, message: dict[str, Any]) -> None:
        self.append(message)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_start_adds_the_context_headers_then_the_hooks_and_stamps_the_first_byte():
    ctx, sent = context(), Sent()
    seen: list[float | None] = []

    def hook(c: RequestContext) -> list[tuple[bytes, bytes]]:
        seen.append(c.timeline.client_first_byte)  # stamped before the hook computes timings
        return [(b"server-timing", b"gateway;dur=0.1")]

    out = ResponseWriter(ctx, sent, hook)
    run(out.start(201, [(b"content-type", b"text/plain")]))
    (start,) = sent
    assert start == {
        "type": "http.response.start",
        "status": 201,
        "headers": [
            (b"content-type", b"text/plain"),
            (b"x-request-id", b"req-1"),
            (b"server-timing", b"gateway;dur=0.1"),
        ],
    }
    assert out.started and not out.finished
    assert ctx.answer.status == 201 and seen == [ctx.timeline.client_first_byte] and seen[0]


def test_only_the_last_body_message_stamps_done():
    ctx, sent = context(), Sent()
    out = ResponseWriter(ctx, sent, None)
    run(out.start(200, []))
    run(out.body(b"data: 1\n\n", more=True))
    assert ctx.timeline.done is None and not out.finished
    run(out.body(b"data: [DONE]\n\n"))
    assert out.finished and ctx.timeline.done is not None
    assert ctx.timeline.done >= ctx.timeline.client_first_byte  # type: ignore[operator]
    assert [m.get("more_body", False) for m in sent[1:]] == [True, False]


def test_whole_sets_the_length_and_json_the_type():
    ctx, sent = context(), Sent()
    run(ResponseWriter(ctx, sent, None).json(200, {"ok": True}))
    start, body = sent
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(body["body"])).encode()
    assert orjson.loads(body["body"]) == {"ok": True}


def test_an_error_is_the_openai_shape_with_should_retry_and_its_own_headers():
    ctx, sent = context(), Sent()
    run(ResponseWriter(ctx, sent, None).error(InvalidRequest("bad body", code="invalid_json")))
    start, body = sent
    assert start["status"] == 400 and dict(start["headers"])[b"x-should-retry"] == b"false"
    assert orjson.loads(body["body"]) == {
        "error": {
            "message": "bad body",
            "type": "invalid_request_error",
            "code": "invalid_json",
            "param": None,
        }
    }
    assert isinstance(ctx.answer.error, InvalidRequest)

    ctx, sent = context(), Sent()
    limited = RateLimited("slow down", code="rate_limit_exceeded", headers=[(b"retry-after", b"7")])
    run(ResponseWriter(ctx, sent, None).error(limited))
    headers = dict(sent[0]["headers"])
    assert sent[0]["status"] == 429 and headers[b"x-should-retry"] == b"true"
    assert headers[b"retry-after"] == b"7"
