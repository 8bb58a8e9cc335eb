"""An upstream that keeps Responses API state as a real server does (docs/spec.md §22).

:class:`ResponsesBackend` is a handler for :class:`tests.support.ScriptedUpstream`: one model
server on its own loopback port, holding the responses *it* created. A follow-up naming a
``previous_response_id`` it does not hold, and ``GET|DELETE /v1/responses/{id}``, ``…/cancel``
and ``…/input_items`` for an id it does not hold, are answered 404 in OpenAI's error shape — so
a gateway that sends a turn to the wrong backend fails the test, as it would fail a real client.

Each answer's text is ``"<backend> turn <n>"``, where n counts the turns of the conversation
this backend holds (1 for a fresh one, the previous turn's n + 1 for a follow-up): a chain of
follow-ups that all reached the owner reads ``turn 1``, ``turn 2``, ``turn 3`` …

``store: false`` responses are answered but kept nowhere; ``background: true`` ones are created
``queued`` (cancellable: ``…/cancel`` makes them ``cancelled``). ``fail_next`` makes the next
requests answer 500 (to eject the backend in the gateway).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.support import LAST_CHUNK, SeenRequest, chunk, http_response, sse_head


@dataclass
class Stored:
    response: dict[str, Any]
    items: list[dict[str, Any]]
    turn: int


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
    return http_response(status, orjson.dumps(body))


def _sse(obj: dict[str, Any]) -> bytes:
    return chunk(f"event: {obj['type']}\n".encode() + b"data: " + orjson.dumps(obj) + b"\n\n")


def _input_items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    items = []
    for item in value if isinstance(value, list) else ():
        content = item.get("content")
        if isinstance(content, str):
            content = [{"type": "input_text", "text": content}]
        items.append(
            {
                "id": f"msg_{secrets.token_hex(6)}",
                "type": "message",
                "role": item.get("role", "user"),
                "status": "completed",
                "content": content,
            }
        )
    return items


@dataclass
class ResponsesBackend:
    """A Responses API server with per-backend state (see the module docstring)."""

    name: str
    #: responses this backend holds, by id
    stored: dict[str, Stored] = field(default_factory=dict)
    #: every request as (method, path, previous_response_id or None), in arrival order
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)
    #: answer the next N requests with a 500 (ejects the backend in the gateway)
    fail_next: int = 0
    _clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1_700_000_000))

    async def __call__(self, req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        path = req.target.split("?", 1)[0].removeprefix("/v1")
        payload = orjson.loads(req.body) if req.body else {}
        previous = payload.get("previous_response_id") if isinstance(payload, dict) else None
        self.seen.append((req.method, path, previous))
        if self.fail_next:
            self.fail_next -= 1
            writer.write(http_response(500, b'{"error": {"message": "boom", "type": "server"}}'))
            return True
        parts = path.strip("/").split("/")
        if parts == ["responses"] and req.method == "POST":
            await self._create(payload, writer)
        elif len(parts) >= 2 and parts[0] == "responses":
            self._on_response(req.method, parts[1], parts[2:], writer)
        else:
            writer.write(_error(404, f"{self.name}: no such path {path}"))
        return True

    # ------------------------------------------------------------ POST /v1/responses

    async def _create(self, payload: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        previous = payload.get("previous_response_id")
        turn = 1
        if previous is not None:
            before = self.stored.get(previous)
            if before is None:
                writer.write(
                    _error(
                        404,
                        f"Previous response with id '{previous}' not found.",
                        "previous_response_id",
                        "previous_response_not_found",
                    )
                )
                return
            turn = before.turn + 1
        rid = f"resp_{secrets.token_hex(12)}"
        background = payload.get("background") is True
        text = f"{self.name} turn {turn}"
        usage = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
        message = {
            "id": f"msg_{secrets.token_hex(6)}",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        response: dict[str, Any] = {
            "id": rid,
            "object": "response",
            "created_at": next(self._clock),
            "status": "queued" if background else "completed",
            "model": payload.get("model", "m"),
            "output": [] if background else [message],
            "usage": None if background else usage,
            "previous_response_id": previous,
            "store": payload.get("store") is not False,
            "background": background,
            "error": None,
            "incomplete_details": None,
            "instructions": payload.get("instructions"),
            "metadata": {},
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "temperature": 1.0,
            "top_p": 1.0,
            "text": {"format": {"type": "text"}},
        }
        if payload.get("store") is not False:
            self.stored[rid] = Stored(response, _input_items(payload.get("input")), turn)
        if payload.get("stream") is not True:
            writer.write(http_response(200, orjson.dumps(response)))
            return
        started = dict(response, status="in_progress", output=[], usage=None)
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": started},
            {"type": "response.in_progress", "response": started},
        ]
        where = {"item_id": message["id"], "output_index": 0, "content_index": 0}
        events += [
            {"type": "response.output_text.delta", **where, "delta": word, "logprobs": []}
            for word in text.split(" ")
        ]
        events.append({"type": "response.completed", "response": response})
        writer.write(sse_head())
        for n, event in enumerate(events):
            writer.write(_sse({**event, "sequence_number": n}))
            await writer.drain()
        writer.write(LAST_CHUNK)

    # ------------------------------------------------------------ /v1/responses/{id}…

    def _on_response(
        self, method: str, rid: str, rest: list[str], writer: asyncio.StreamWriter
    ) -> None:
        stored = self.stored.get(rid)
        if stored is None:
            writer.write(_error(404, f"Response with id '{rid}' not found."))
            return
        response = stored.response
        if not rest and method == "GET":
            writer.write(http_response(200, orjson.dumps(response)))
        elif not rest and method == "DELETE":
            del self.stored[rid]
            deleted = {"id": rid, "object": "response.deleted", "deleted": True}
            writer.write(http_response(200, orjson.dumps(deleted)))
        elif rest == ["cancel"] and method == "POST":
            if not response["background"]:
                writer.write(_error(400, "Only background responses can be cancelled."))
                return
            if response["status"] in ("queued", "in_progress"):
                response["status"] = "cancelled"
            writer.write(http_response(200, orjson.dumps(response)))
        elif rest == ["input_items"] and method == "GET":
            items = stored.items
            page = {
                "object": "list",
                "data": items,
                "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None,
                "has_more": False,
            }
            writer.write(http_response(200, orjson.dumps(page)))
        else:
            writer.write(_error(404, f"{self.name}: no such path for {rid}"))


def two_backend_config(
    a_url: str, b_url: str, strategy: str = "weighted", extra: str = "", backend_extra: str = ""
) -> str:
    """TOML: backends ``a`` and ``b`` balanced on one catch-all route (``strategy``)."""
    weights = "weights = [1, 1]" if strategy == "weighted" else ""
    return f"""
[[backends]]
name = "a"
url = "{a_url}"
api_key_env = "TEST_BACKEND_KEY"
{backend_extra}

[[backends]]
name = "b"
url = "{b_url}"
api_key_env = "TEST_BACKEND_KEY"
{backend_extra}

[[routes]]
models = ["*"]
backends = ["a", "b"]
strategy = "{strategy}"
{weights}
{extra}
"""
