"""The built-in A2A agent of the embedded default (docs/spec.md §30): an echo agent served in
process behind ``url = "mock://"``, so the official A2A SDK works against ``gateway serve`` with
no external service.

It speaks A2A 1.0's JSON-RPC binding (its card lists that interface only): ``SendMessage``
answers a completed task whose artifact is the message's text; ``SendStreamingMessage``
streams the task, a working status, the answer word by word as artifact chunks, and the
completed status. A text starting with ``/time`` or ``/echo`` calls the built-in MCP server's
tool of that name (:mod:`gateway.mock.mcp`) and answers its result; ``/ask`` leaves the task
waiting for input (the next message naming the task completes it). ``GetTask``,
``CancelTask``, ``SubscribeToTask`` and ``ListTasks`` work on the tasks it keeps (the last
:data:`MAX_TASKS`). Its object is shaped like an upstream transport
(:class:`gateway.transports.base.Transport`): the gateway sends it requests as it would over a
socket.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.mock.mcp import BuiltinMcpServer, BuiltinResponse

MAX_TASKS = 1000
_JSON = (b"content-type", b"application/json")
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_TERMINAL = frozenset({"TASK_STATE_COMPLETED", "TASK_STATE_CANCELED", "TASK_STATE_FAILED"})


def card() -> dict[str, Any]:
    return {
        "name": "Echo (built-in)",
        "description": "The gateway's built-in A2A agent: it echoes what it is told, word by "
        "word, and calls the built-in MCP tools for '/time' and '/echo TEXT'.",
        "version": "1.0.0",
        "supportedInterfaces": [
            {"url": "mock:///rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [
            {"id": "echo", "name": "Echo", "description": "Echoes the text.", "tags": ["echo"]},
            {
                "id": "tools",
                "name": "MCP tools",
                "description": "'/time' and '/echo TEXT' call the built-in MCP server's tools.",
                "tags": ["mcp"],
            },
        ],
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text(message: dict[str, Any]) -> str:
    parts = message.get("parts")
    texts = [
        p["text"] for p in parts or () if isinstance(p, dict) and isinstance(p.get("text"), str)
    ]
    return " ".join(texts)


def _rpc(rid: Any, result: Any = None, error: tuple[int, str] | None = None) -> bytes:
    if error is not None:
        return orjson.dumps(
            {"jsonrpc": "2.0", "id": rid, "error": {"code": error[0], "message": error[1]}}
        )
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})


class BuiltinAgent:
    """The in-process agent (a :class:`gateway.transports.base.Transport` in shape)."""

    def __init__(self, base_url: str = "mock://") -> None:
        self._tasks: dict[str, dict[str, Any]] = {}
        self._tools = BuiltinMcpServer()

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: object
    ) -> BuiltinResponse:
        if method == "GET" and url.endswith("/.well-known/agent-card.json"):
            return BuiltinResponse(200, [_JSON], [orjson.dumps(card())])
        if method != "POST" or not url.endswith("/rpc"):
            return BuiltinResponse(404, [_JSON], [b'{"error": "not found"}'])
        try:
            msg = orjson.loads(body if isinstance(body, bytes) else b"")
        except orjson.JSONDecodeError:
            return BuiltinResponse(200, [_JSON], [_rpc(None, error=(-32700, "parse error"))])
        rid = msg.get("id") if isinstance(msg, dict) else None
        params = msg.get("params") if isinstance(msg, dict) else None
        name = msg.get("method") if isinstance(msg, dict) else None
        if not isinstance(params, dict):
            return BuiltinResponse(200, [_JSON], [_rpc(rid, error=(-32602, "invalid params"))])
        if name in ("SendMessage", "SendStreamingMessage"):
            return await self._send(rid, params, name == "SendStreamingMessage")
        if name == "ListTasks":
            tasks = list(self._tasks.values())
            if isinstance(params.get("contextId"), str):
                tasks = [t for t in tasks if t["contextId"] == params["contextId"]]
            result = {"tasks": tasks, "nextPageToken": "", "pageSize": len(tasks)}
            return BuiltinResponse(200, [_JSON], [_rpc(rid, result | {"totalSize": len(tasks)})])
        task = self._tasks.get(params.get("id"))  # type: ignore[arg-type]
        if name not in ("GetTask", "CancelTask", "SubscribeToTask"):
            return BuiltinResponse(200, [_JSON], [_rpc(rid, error=(-32601, "method not found"))])
        if task is None:
            return BuiltinResponse(200, [_JSON], [_rpc(rid, error=(-32001, "Task not found"))])
        return self._on_task(rid, name, task)

    def _on_task(self, rid: Any, name: str, task: dict[str, Any]) -> BuiltinResponse:
        state = task["status"]["state"]
        if name == "GetTask":
            return BuiltinResponse(200, [_JSON], [_rpc(rid, task)])
        if state in _TERMINAL:
            code = (-32002, "Task is not cancelable") if name == "CancelTask" else None
            error = code or (-32004, "the task is over: nothing to subscribe to")
            return BuiltinResponse(200, [_JSON], [_rpc(rid, error=error)])
        if name == "CancelTask":
            task["status"] = {"state": "TASK_STATE_CANCELED", "timestamp": _now()}
            return BuiltinResponse(200, [_JSON], [_rpc(rid, task)])
        return BuiltinResponse(200, _SSE, [b"data: " + _rpc(rid, {"task": task}) + b"\n\n"])

    async def _send(self, rid: Any, params: dict[str, Any], stream: bool) -> BuiltinResponse:
        message = params.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("messageId"), str):
            return BuiltinResponse(200, [_JSON], [_rpc(rid, error=(-32602, "invalid params"))])
        task = self._tasks.get(message.get("taskId"))  # type: ignore[arg-type]
        if message.get("taskId") is not None and task is None:
            return BuiltinResponse(200, [_JSON], [_rpc(rid, error=(-32001, "Task not found"))])
        if task is None:
            context = message.get("contextId")
            task = {
                "id": str(uuid.uuid4()),
                "contextId": context if isinstance(context, str) else str(uuid.uuid4()),
                "history": [],
                "artifacts": [],
            }
            while len(self._tasks) >= MAX_TASKS:
                del self._tasks[next(iter(self._tasks))]
            self._tasks[task["id"]] = task
        elif task["status"]["state"] in _TERMINAL:
            error = (-32004, "the task is over: start a new one")
            return BuiltinResponse(200, [_JSON], [_rpc(rid, error=error)])
        task["history"].append(message | {"taskId": task["id"], "contextId": task["contextId"]})
        answer = await self._answer(_text(message))
        if answer is None:
            task["status"] = {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": _now()}
            return self._reply(rid, task, [], stream)
        words = answer.split(" ")
        artifact = {"artifactId": "answer", "name": "answer", "parts": [{"text": answer}]}
        task["artifacts"] = [artifact]
        task["status"] = {"state": "TASK_STATE_COMPLETED", "timestamp": _now()}
        return self._reply(rid, task, words, stream)

    def _reply(
        self, rid: Any, task: dict[str, Any], words: list[str], stream: bool
    ) -> BuiltinResponse:
        if not stream:
            return BuiltinResponse(200, [_JSON], [_rpc(rid, {"task": task})])
        ids = {"taskId": task["id"], "contextId": task["contextId"]}
        submitted = task | {"status": {"state": "TASK_STATE_SUBMITTED"}, "artifacts": []}
        events: list[Any] = [
            {"task": submitted},
            {"statusUpdate": ids | {"status": {"state": "TASK_STATE_WORKING"}}},
        ]
        for i, word in enumerate(words):
            chunk = {"artifactId": "answer", "parts": [{"text": word if i == 0 else " " + word}]}
            last = i == len(words) - 1
            update = ids | {"artifact": chunk, "append": i > 0, "lastChunk": last}
            events.append({"artifactUpdate": update})
        events.append({"statusUpdate": ids | {"status": task["status"]}})
        return BuiltinResponse(200, _SSE, [b"data: " + _rpc(rid, e) + b"\n\n" for e in events])

    async def _answer(self, text: str) -> str | None:
        """The answer to ``text`` (None: the agent asks for more input)."""
        command, _, rest = text.partition(" ")
        if command == "/ask":
            return None
        if command not in ("/time", "/echo"):
            return text or "(an empty message)"
        call = {"name": command[1:], "arguments": {"text": rest} if command == "/echo" else {}}
        body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call})
        resp = await self._tools.request("POST", "mock://", [], body)
        result = orjson.loads(b"".join([c async for c in resp.aiter_raw()]))["result"]
        return " ".join(c["text"] for c in result["content"] if c.get("type") == "text")

    async def aclose(self) -> None:
        return None


__all__ = ["MAX_TASKS", "BuiltinAgent", "card"]
