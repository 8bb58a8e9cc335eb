"""The mock backend's Realtime API (docs/spec.md §19): a text-modality session over WebSocket.

One :class:`MockRealtime` per session speaks the GA event names the official ``openai`` SDK's
``client.realtime.connect()`` parses::

    server: session.created (at once)
    client: session.update                → session.updated
    client: conversation.item.create      → conversation.item.added, conversation.item.done
    client: response.create               → response.created, response.output_item.added,
                                            response.content_part.added,
                                            response.output_text.delta (N, paced),
                                            response.output_text.done, response.content_part.done,
                                            response.output_item.done, response.done (usage)
    client: response.cancel               → response.done (status "cancelled")
    client: input_audio_buffer.commit     → input_audio_buffer.committed
    client: input_audio_buffer.append / .clear: accepted silently
    anything else (or a binary message, or not JSON) → an ``error`` event; the session stays open

Pacing follows the mock's knobs (:class:`~gateway.mock.engine.MockSettings`): ``ttft_ms`` from
``response.create`` to the first delta, then ``tokens_per_s``; ``output_tokens`` (or the
response's ``max_output_tokens``) deltas. ``response.done`` carries usage as the Realtime API
reports it: ``input_tokens`` (every conversation item's words), of which
``input_token_details.cached_tokens`` are those of the items an earlier response already read
(the prompt cache a real provider would hit), and ``output_tokens``.

A model named ``mock-status-NNN`` refuses the handshake with HTTP status NNN and an OpenAI error
body (:func:`handshake_refusal`), as the HTTP endpoints answer it.

The same session runs behind ``gateway mock-upstream`` (:func:`websocket_endpoint`, a starlette
WebSocket route) and in process for ``mock://`` backends (the gateway's realtime package feeds
it directly, no socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from gateway.mock.engine import MockSettings

#: what the session writes to its client (a JSON text message)
Emit = Callable[[str], Awaitable[None]]

_VOCABULARY = (  # noqa: SIM905
    "realtime sessions relay every event as it arrives through the gateway with honest "
    "timings per frame and spans per response while voices and agents talk live"
).split()
_STATUS_MODEL = re.compile(r"mock-status-([1-5][0-9][0-9])")
_ids = itertools.count(1)


def _id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):012d}"


def handshake_refusal(model: str) -> tuple[int, bytes] | None:
    """``(status, body)`` for a handshake the mock refuses (``mock-status-NNN``), else None."""
    m = _STATUS_MODEL.fullmatch(model)
    if m is None:
        return None
    status = int(m.group(1))
    body = orjson.dumps(
        {
            "error": {
                "message": f"mock: this model answers {status}",
                "type": "invalid_request_error" if status < 500 else "server_error",
                "code": f"mock_status_{status}",
                "param": None,
            }
        }
    )
    return status, body


def _words(value: Any) -> int:
    """Words in the text parts of a conversation item (the mock's token count)."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, dict):
        return sum(_words(v) for k, v in value.items() if k in ("text", "content", "transcript"))
    if isinstance(value, list):
        return sum(_words(v) for v in value)
    return 0


class MockRealtime:
    """One session: conversation items, responses (one at a time), usage."""

    def __init__(self, settings: MockSettings, model: str, emit: Emit) -> None:
        self.settings = settings
        self.model = model
        self._emit = emit
        self.session: dict[str, Any] = {
            "type": "realtime",
            "object": "realtime.session",
            "id": _id("sess"),
            "model": model,
            "output_modalities": ["text"],
            "instructions": "",
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf",
        }
        self._items: list[str] = []
        #: words of the conversation items, and how many of them a response has already read
        self._tokens = 0
        self._cached = 0
        self._response: asyncio.Task[None] | None = None
        self._closing = False

    async def send(self, obj: dict[str, Any]) -> None:
        obj["event_id"] = _id("event")
        await self._emit(orjson.dumps(obj).decode())

    async def open(self) -> None:
        await self.send({"type": "session.created", "session": self.session})

    async def receive(self, message: str | bytes) -> None:
        """Handle one client message."""
        if isinstance(message, bytes):
            await self._error("invalid_request_error", "binary messages are not events")
            return
        try:
            event = orjson.loads(message)
        except orjson.JSONDecodeError:
            await self._error("invalid_request_error", "the message is not JSON")
            return
        kind = event.get("type") if isinstance(event, dict) else None
        handler = self._HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            await self._error("invalid_request_error", f"unknown event type {kind!r}", "unknown")
            return
        await handler(self, event)

    async def aclose(self) -> None:
        """The session is over: a response in progress stops without another event."""
        self._closing = True
        task, self._response = self._response, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------ client events

    async def _session_update(self, event: dict[str, Any]) -> None:
        update = event.get("session")
        if isinstance(update, dict):
            self.session.update({k: v for k, v in update.items() if k not in ("id", "object")})
        await self.send({"type": "session.updated", "session": self.session})

    async def _item_create(self, event: dict[str, Any]) -> None:
        item = event.get("item")
        if not isinstance(item, dict):
            await self._error("invalid_request_error", "conversation.item.create needs an item")
            return
        item = {**item, "id": item.get("id") or _id("item"), "status": "completed"}
        item.setdefault("object", "realtime.item")
        previous = self._items[-1] if self._items else None
        self._items.append(item["id"])
        self._tokens += _words(item.get("content"))
        await self.send(
            {"type": "conversation.item.added", "previous_item_id": previous, "item": item}
        )
        await self.send(
            {"type": "conversation.item.done", "previous_item_id": previous, "item": item}
        )

    async def _response_create(self, event: dict[str, Any]) -> None:
        if self._response is not None and not self._response.done():
            await self._error(
                "invalid_request_error",
                "Conversation already has an active response in progress",
                "conversation_already_has_active_response",
            )
            return
        options = event.get("response")
        limit = options.get("max_output_tokens") if isinstance(options, dict) else None
        count = self.settings.output_tokens
        if type(limit) is int and 0 < limit < count:
            count = limit
        self._response = asyncio.get_running_loop().create_task(self._respond(count))

    async def _response_cancel(self, event: dict[str, Any]) -> None:
        task = self._response
        if task is not None and not task.done():
            task.cancel()

    async def _commit(self, event: dict[str, Any]) -> None:
        item_id = _id("item")
        previous = self._items[-1] if self._items else None
        await self.send(
            {
                "type": "input_audio_buffer.committed",
                "previous_item_id": previous,
                "item_id": item_id,
            }
        )

    async def _ignore(self, event: dict[str, Any]) -> None:
        return None

    _HANDLERS: dict[str, Callable[[MockRealtime, dict[str, Any]], Awaitable[None]]] = {
        "session.update": _session_update,
        "conversation.item.create": _item_create,
        "response.create": _response_create,
        "response.cancel": _response_cancel,
        "input_audio_buffer.commit": _commit,
        "input_audio_buffer.append": _ignore,
        "input_audio_buffer.clear": _ignore,
    }

    async def _error(self, kind: str, message: str, code: str | None = None) -> None:
        await self.send(
            {
                "type": "error",
                "error": {"type": kind, "code": code, "message": message, "param": None},
            }
        )

    # ------------------------------------------------------------ a response

    async def _respond(self, count: int) -> None:
        rid, iid = _id("resp"), _id("item")
        response: dict[str, Any] = {
            "object": "realtime.response",
            "id": rid,
            "status": "in_progress",
            "output": [],
            "output_modalities": ["text"],
            "usage": None,
        }
        where = {"response_id": rid, "item_id": iid, "output_index": 0, "content_index": 0}
        item: dict[str, Any] = {
            "id": iid,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        await self.send({"type": "response.created", "response": response})
        await self.send(
            {
                "type": "response.output_item.added",
                "response_id": rid,
                "output_index": 0,
                "item": item,
            }
        )
        await self.send({"type": "response.content_part.added", **where, "part": _part("")})
        pieces: list[str] = []
        status = "completed"
        try:
            await self._pace(count, pieces, where)
        except asyncio.CancelledError:
            if self._closing:
                raise
            status = "cancelled"  # response.cancel: the response ends, the session goes on
        text = "".join(pieces)
        item = {**item, "status": "completed" if status == "completed" else "incomplete"}
        item["content"] = [_part(text)]
        if status == "completed":
            await self.send({"type": "response.output_text.done", **where, "text": text})
            await self.send({"type": "response.content_part.done", **where, "part": _part(text)})
            await self.send(
                {
                    "type": "response.output_item.done",
                    "response_id": rid,
                    "output_index": 0,
                    "item": item,
                }
            )
        usage = self._usage(len(pieces))
        self._cached = self._tokens  # the next response reads these from the "prompt cache"
        response = {**response, "status": status, "output": [item], "usage": usage}
        if status == "cancelled":
            response["status_details"] = {"type": "cancelled", "reason": "client_cancelled"}
        await self.send({"type": "response.done", "response": response})

    def _usage(self, output: int) -> dict[str, Any]:
        """``response.done``'s usage, in the GA shape (cached input tokens included)."""
        return {
            "total_tokens": self._tokens + output,
            "input_tokens": self._tokens,
            "output_tokens": output,
            "input_token_details": {
                "cached_tokens": self._cached,
                "text_tokens": self._tokens,
                "audio_tokens": 0,
                "image_tokens": 0,
            },
            "output_token_details": {"text_tokens": output, "audio_tokens": 0},
        }

    async def _pace(self, count: int, pieces: list[str], where: dict[str, Any]) -> None:
        s = self.settings
        if s.ttft_ms:
            await asyncio.sleep(s.ttft_ms / 1000)
        gap = 1.0 / s.tokens_per_s if s.tokens_per_s else 0.0
        for i in range(count):
            if i and gap:
                await asyncio.sleep(gap)
            piece = (" " if i else "") + _VOCABULARY[(i + len(self._items)) % len(_VOCABULARY)]
            pieces.append(piece)
            await self.send({"type": "response.output_text.delta", **where, "delta": piece})


def _part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def websocket_endpoint(base: MockSettings) -> Callable[[Any], Awaitable[None]]:
    """The ``/v1/realtime`` WebSocket route of ``gateway mock-upstream`` (starlette)."""
    from starlette.responses import Response
    from starlette.websockets import WebSocket, WebSocketDisconnect

    async def endpoint(ws: WebSocket) -> None:
        model = ws.query_params.get("model", "")
        refusal = handshake_refusal(model)
        try:
            settings = base.from_headers(ws.headers)
        except ValueError as exc:
            refusal = (
                400,
                orjson.dumps(
                    {
                        "error": {
                            "message": str(exc),
                            "type": "invalid_request_error",
                            "code": None,
                            "param": None,
                        }
                    }
                ),
            )
        if refusal is not None:
            status, body = refusal
            await ws.send_denial_response(Response(body, status, media_type="application/json"))
            return
        if settings.latency_ms:
            await asyncio.sleep(settings.latency_ms / 1000)
        offered = ws.scope.get("subprotocols") or []
        await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        session = MockRealtime(settings, model, ws.send_text)
        try:
            await session.open()
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("text")
                await session.receive(data if data is not None else message.get("bytes") or b"")
        except WebSocketDisconnect:
            return
        finally:
            await session.aclose()

    return endpoint


__all__ = ["MockRealtime", "handshake_refusal", "websocket_endpoint"]
