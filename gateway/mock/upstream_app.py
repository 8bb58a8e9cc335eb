"""``gateway mock-upstream``: the mock engine behind a real HTTP server (starlette + uvicorn).

Serves ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``,
``/v1/responses`` (OpenAI Responses API) and ``/v1/messages``, ``/v1/messages/count_tokens``
(Anthropic Messages API: point the Anthropic SDK's ``base_url`` at the root, without ``/v1``).
With ``--capacity N`` it is a small model server (a bounded batch, a real queue) whose load
``GET /metrics`` reports in vLLM's names (docs/spec.md §21).
"""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute

from gateway.mock.engine import MockSettings, bad_request, reply
from gateway.mock.realtime import websocket_endpoint
from gateway.mock.stateful import MockObjects

#: what vLLM's /metrics answers (prometheus-client's CONTENT_TYPE_LATEST)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def create_mock_app(settings: MockSettings | None = None) -> Starlette:
    base = settings or MockSettings()
    objects = MockObjects()  # this server's files, batches, ... (docs/spec.md §24)

    async def handle(request: Request) -> Response:
        path = request.url.path[len("/v1") :]
        try:
            knobs = base.from_headers(request.headers)
        except ValueError as exc:
            r = bad_request(path, str(exc))
        else:
            body = await request.body()
            stored = objects.reply(request.method, path, request.headers, body)
            r = stored if stored is not None else reply(request.method, path, body, knobs)
        if r.delay_s:
            await asyncio.sleep(r.delay_s)
        if r.events is not None:
            return StreamingResponse(
                r.events, media_type=r.content_type, headers={"cache-control": "no-cache"}
            )
        return Response(r.body, status_code=r.status, media_type=r.content_type)

    async def metrics(_request: Request) -> Response:
        # a model server's load, in vLLM's names (docs/spec.md §21): gateway/mock/capacity.py
        if base.capacity is None:
            return Response(
                b"the mock has no capacity: start it with --capacity N\n", status_code=404
            )
        return Response(base.capacity.metrics(), media_type=METRICS_TYPE)

    app = Starlette(
        routes=[
            # the Realtime API over WebSocket (docs/spec.md §19): gateway/mock/realtime.py
            WebSocketRoute("/v1/realtime", websocket_endpoint(base)),
            Route("/v1/{path:path}", handle, methods=["GET", "POST", "DELETE"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
    )
    app.state.objects = objects  # what tests look at
    return app
