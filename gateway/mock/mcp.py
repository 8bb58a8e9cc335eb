"""The built-in MCP server of the embedded default (docs/spec.md §23): two harmless tools,
``echo`` and ``time``, served in process behind ``url = "mock://"`` so ``gateway serve`` shows
the whole MCP flow with no external service.

It speaks the Streamable HTTP transport's handshake era (revisions 2025-03-26 … 2025-11-25):
``initialize`` answers with a session id, notifications get 202, ``tools/call`` answers as an
SSE stream (a progress notification, then the result) when the client accepts one and asked
for progress, else as JSON. ``server/discover`` (the 2026 probe) is "method not found", so a
client falls back to ``initialize``. Its object is shaped like an upstream transport
(:class:`gateway.transports.base.Transport`): the gateway sends it requests as it would over
a socket.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.types import RawHeaders

VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Echo the text back (a harmless tool of the gateway's built-in server).",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "time",
        "description": "The current UTC time (ISO 8601).",
        "inputSchema": {"type": "object", "properties": {}},
    },
]
_JSON = (b"content-type", b"application/json")


class BuiltinResponse:
    """One answer, shaped like :class:`gateway.transports.base.UpstreamResponse`."""

    __slots__ = ("_chunks", "headers", "status")
    #: no socket: the gateway times the attempt around the call
    started_at = sent_at = first_byte_at = done_at = None

    def __init__(self, status: int, headers: RawHeaders, chunks: list[bytes]) -> None:
        self.status = status
        self.headers = headers
        self._chunks = chunks

    def complete_body(self, limit: int) -> bytes | None:
        return None  # MCP answers are read chunk by chunk

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    async def aclose(self) -> None:
        return None


def _error(rid: Any, code: int, message: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})


def _result(rid: Any, result: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})


def _call(params: dict[str, Any]) -> dict[str, Any]:
    name, args = params.get("name"), params.get("arguments") or {}
    if name == "echo":
        text = args.get("text") if isinstance(args, dict) else None
        if not isinstance(text, str):
            return {"content": [{"type": "text", "text": "echo needs 'text'"}], "isError": True}
        return {"content": [{"type": "text", "text": text}], "isError": False}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    return {"content": [{"type": "text", "text": now}], "isError": False}


class BuiltinMcpServer:
    """The in-process MCP server (a :class:`gateway.transports.base.Transport` in shape)."""

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: object
    ) -> BuiltinResponse:
        if method == "DELETE":
            return BuiltinResponse(200, [], [])
        if method != "POST":  # no server-initiated messages: no GET stream (the spec allows 405)
            return BuiltinResponse(405, [(b"allow", b"POST, DELETE")], [])
        raw = body if isinstance(body, bytes) else b""
        try:
            msg = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return BuiltinResponse(400, [_JSON], [_error(None, -32700, "parse error")])
        if not isinstance(msg, dict):
            return BuiltinResponse(400, [_JSON], [_error(None, -32600, "invalid request")])
        rid, name = msg.get("id"), msg.get("method")
        got = msg.get("params")
        params: dict[str, Any] = got if isinstance(got, dict) else {}
        if rid is None:  # a notification or a response: accepted
            return BuiltinResponse(202, [], [])
        out: RawHeaders = [_JSON]
        if name == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in VERSIONS else VERSIONS[-1]
            out.append((b"mcp-session-id", secrets.token_hex(16).encode()))
            result = {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "llm-gateway-builtin", "version": "1"},
            }
            return BuiltinResponse(200, out, [_result(rid, result)])
        if name == "ping":
            return BuiltinResponse(200, out, [_result(rid, {})])
        if name == "tools/list":
            return BuiltinResponse(200, out, [_result(rid, {"tools": TOOLS})])
        if name == "tools/call":
            if params.get("name") not in ("echo", "time"):
                return BuiltinResponse(200, out, [_error(rid, -32602, "unknown tool")])
            answer = _result(rid, _call(params))
            meta = params.get("_meta")
            token = meta.get("progressToken") if isinstance(meta, dict) else None
            accepts = any(k == "accept" and "text/event-stream" in v for k, v in headers)
            if token is None or not accepts:
                return BuiltinResponse(200, out, [answer])
            progress = orjson.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {"progressToken": token, "progress": 1, "total": 1},
                }
            )
            sse = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            events = [b"event: message\ndata: " + m + b"\n\n" for m in (progress, answer)]
            return BuiltinResponse(200, sse, events)
        return BuiltinResponse(200, out, [_error(rid, -32601, f"method not found: {name}")])

    async def aclose(self) -> None:
        return None


__all__ = ["TOOLS", "BuiltinMcpServer", "BuiltinResponse"]
