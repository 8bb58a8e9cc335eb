"""A real A2A agent built with the official ``a2a-sdk`` server (``DefaultRequestHandler``,
``InMemoryTaskStore``, its JSON-RPC and HTTP+JSON routes, 1.0 and 0.3), run in a process of its
own by the tests: ``python -m tests.a2a.agent_server PORT``.

Its executor answers by the text it gets:

- ``wait``: the task stays working until it is canceled (or 30 s pass);
- ``ask``: the task asks for input (an interrupted state: the stream ends there);
- anything else: a status update, the text echoed back as an artifact in two chunks, done.

``GET /_seen`` tells what reached it: each request's method, path, headers and body, so a test
proves what the gateway forwarded (and what it did not).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import uvicorn
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

SEEN: list[dict[str, Any]] = []


class Executor(AgentExecutor):
    def __init__(self) -> None:
        self.cancelled: set[str] = set()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message, task_id, context_id = context.message, context.task_id, context.context_id
        if message is None or not task_id or not context_id:
            return
        if context.current_task is None:
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[message],
                )
            )
        updater = TaskUpdater(event_queue=event_queue, task_id=task_id, context_id=context_id)
        text = context.get_user_input()
        await updater.start_work(updater.new_agent_message(parts=[Part(text="working")]))
        if text == "wait":
            for _ in range(300):
                if task_id in self.cancelled:
                    return
                await asyncio.sleep(0.1)
        if text == "ask":
            await updater.requires_input(updater.new_agent_message(parts=[Part(text="more?")]))
            return
        half = len(text) // 2
        await updater.add_artifact([Part(text=text[:half])], artifact_id="a1", name="echo")
        await updater.add_artifact(
            [Part(text=text[half:])], artifact_id="a1", append=True, last_chunk=True
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        self.cancelled.add(task_id)
        updater = TaskUpdater(
            event_queue=event_queue, task_id=task_id, context_id=context.context_id or ""
        )
        await updater.cancel()


def card(base: str) -> AgentCard:
    interfaces = [
        AgentInterface(protocol_binding=b, protocol_version=v, url=f"{base}{path}")
        for b, path in (("JSONRPC", "/rpc"), ("HTTP+JSON", "/rest"))
        for v in ("1.0", "0.3")
    ]
    return AgentCard(
        name="Echo",
        description="Echoes what it is told.",
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=True, push_notifications=True),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[AgentSkill(id="echo", name="Echo", description="Echo.", tags=["echo"])],
        supported_interfaces=interfaces,
    )


class Recorder:
    """Notes every request (headers and body) before the SDK's routes see it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/_seen":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        SEEN.append(
            {
                "method": scope["method"],
                "path": scope["path"],
                "query": scope["query_string"].decode(),
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                "body": body.decode(),
            }
        )
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def seen(_: Request) -> JSONResponse:
    return JSONResponse(SEEN)


def app(port: int) -> ASGIApp:
    agent_card = card(f"http://127.0.0.1:{port}")
    handler = DefaultRequestHandler(
        agent_executor=Executor(), task_store=InMemoryTaskStore(), agent_card=agent_card
    )
    routes = [
        *create_agent_card_routes(agent_card=agent_card),
        *create_jsonrpc_routes(request_handler=handler, rpc_url="/rpc", enable_v0_3_compat=True),
        *create_rest_routes(request_handler=handler, path_prefix="/rest", enable_v0_3_compat=True),
        Route("/_seen", seen),
    ]
    return Recorder(Starlette(routes=routes))


def main() -> None:
    port = int(sys.argv[1])
    uvicorn.run(app(port), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
