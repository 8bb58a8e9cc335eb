"""``gateway mock-upstream``: the mock engine behind a real HTTP server (starlette + uvicorn).

Serves ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``.
"""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gateway.mock.engine import MockSettings, reply


def create_mock_app(settings: MockSettings | None = None) -> Starlette:
    base = settings or MockSettings()

    async def handle(request: Request) -> Response:
        try:
            knobs = base.from_headers(request.headers)
        except ValueError as exc:
            return Response(str(exc), status_code=400)
        path = request.url.path[len("/v1") :]
        r = reply(request.method, path, await request.body(), knobs)
        if r.delay_s:
            await asyncio.sleep(r.delay_s)
        if r.events is not None:
            return StreamingResponse(
                r.events, media_type=r.content_type, headers={"cache-control": "no-cache"}
            )
        return Response(r.body, status_code=r.status, media_type=r.content_type)

    return Starlette(
        routes=[Route("/v1/{path:path}", handle, methods=["GET", "POST"])],
    )
