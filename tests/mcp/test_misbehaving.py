"""MCP servers that do what a well-behaved one would not, and clients that send what MCP says
they MUST NOT (docs/spec.md §23): the gateway stops at the answer, filters every tool list
whatever its id or spelling, and refuses requests without a proper id.

The misbehaving server is a raw HTTP/1.1 server on loopback (tests/support.py's
``ScriptedUpstream``): every SSE answer stays open after the answer event (for longer than the
server's ``timeout_s``), and the id of each request the test sends chooses how it answers.
The client is the official ``mcp`` SDK where it can be, raw HTTP where the SDK would never send
or accept the message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx2
import orjson
import pytest

from gateway.config import Config
from tests.mcp.mcp_support import mcp_client
from tests.support import (
    LAST_CHUNK,
    ScriptedUpstream,
    SeenRequest,
    chunk,
    gateway_config,
    http_response,
    sse_head,
)

#: an SSE answer stays open this long after its answer event (longer than timeout_s)
HOLD_S = 30.0
TIMEOUT_S = 5
TOOLS = [
    {"name": "echo", "description": "echo", "inputSchema": {"type": "object"}},
    {"name": "secret", "description": "denied by the config", "inputSchema": {"type": "object"}},
]
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _event(msg: dict[str, Any] | bytes, event_id: str | None = None) -> bytes:
    data = msg if isinstance(msg, bytes) else orjson.dumps(msg)
    head = f"id: {event_id}\n".encode() if event_id else b""
    return head + b"event: message\ndata: " + data + b"\n\n"


def _result(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def _answer(msg: dict[str, Any]) -> tuple[str, list[bytes]]:
    """How the server answers: "json" and a body, or "sse" and its events."""
    rid, method = msg.get("id"), msg.get("method")
    if method == "initialize":
        init = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}}
        return "sse", [
            _event(_result(rid, {**init, "serverInfo": {"name": "raw", "version": "1"}}))
        ]
    if method == "tools/call":
        progress = {"jsonrpc": "2.0", "method": "notifications/progress"}
        progress["params"] = {"progressToken": 1, "progress": 1}
        text = {"content": [{"type": "text", "text": "echoed"}], "isError": False}
        return "sse", [_event(progress), _event(_result(rid, text))]
    tools = {"tools": TOOLS}
    if rid == "other-json":  # the answer under another id
        return "json", [orjson.dumps(_result("someone-else", tools))]
    if rid == "other-sse":  # a tool list under another id first, then the real answer
        return "sse", [_event(_result("someone-else", tools), "e1"), _event(_result(rid, tools))]
    if rid == "escaped":  # the member's name written with JSON escapes
        body = orjson.dumps(_result(rid, tools)).replace(b'"tools"', b'"\\u0074ool\\u0073"')
        return "json", [body]
    if rid == "duplicate":  # two members named tools: a parser that takes the first sees secret
        first, last = orjson.dumps(TOOLS), orjson.dumps(TOOLS[:1])
        body = b'{"jsonrpc":"2.0","id":"duplicate","result":{"tools":%b,"tools":%b}}'
        return "json", [body % (first, last)]
    if rid in ("unreadable-json", "unreadable-sse"):  # NaN: no JSON, yet some parsers read it
        body = orjson.dumps(_result(rid, tools))[:-1] + b',"n":NaN}'
        return ("json" if rid == "unreadable-json" else "sse"), [
            body if rid == "unreadable-json" else _event(body)
        ]
    if method == "ping":  # a tool list nobody asked for
        return "json", [orjson.dumps(_result(rid, tools))]
    if method == "tools/list":
        return "sse", [_event(_result(rid, tools))]
    return "json", [orjson.dumps(_result(rid, {}))]


async def _handle(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
    if req.method != "POST":
        writer.write(http_response(405, b"", extra=[("allow", "POST")]))
        return True
    msg = orjson.loads(req.body)
    if "id" not in msg or "method" not in msg:  # a notification, or an answer of the client
        writer.write(http_response(202, b""))
        return True
    kind, parts = _answer(msg)
    if kind == "json":
        writer.write(http_response(200, parts[0], extra=[("mcp-session-id", "raw-session")]))
        return True
    writer.write(sse_head([("mcp-session-id", "raw-session")]))
    for part in parts:
        writer.write(chunk(part))
    await writer.drain()
    await asyncio.sleep(HOLD_S)  # the answer went out; the stream stays open
    writer.write(LAST_CHUNK)
    return False


@pytest.fixture
def raw() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream(_handle).start()
    yield server
    server.stop()


def raw_config(url: str) -> Config:
    return gateway_config(
        f"""
[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
models = ["*"]
backends = ["mock"]

[[mcp_servers]]
name = "raw"
url = "{url}"
tools_deny = ["secret"]
timeout_s = {TIMEOUT_S}
"""
    )


def _body(resp: httpx2.Response) -> bytes:
    return resp.read()


def _rpc(rid: Any, method: str = "tools/list") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {}}


def test_the_aggregate_stops_reading_an_sse_answer_at_the_answer(gateway, raw):
    """The server keeps every SSE answer open past ``timeout_s``: /mcp's own handshake and
    tools/list read to the answer only (else the server would be left out of the list)."""
    gw = gateway(raw_config(raw.url.removesuffix("/v1") + "/mcp"))

    async def scenario() -> tuple[list[str], str]:
        async with mcp_client(gw.url + "/mcp", mode="legacy") as client:
            names = [t.name for t in (await client.list_tools()).tools]
            result = await client.call_tool("raw__echo", {"text": "hi"})
            return names, result.content[0].text

    names, text = asyncio.run(scenario())
    assert names == ["raw__echo"]  # listed, and "secret" dropped
    assert text == "echoed"
    # the gateway's own requests never reuse an id in the upstream session
    ids = [orjson.loads(r.body).get("id") for r in raw.requests if r.body]
    own = [i for i in ids if isinstance(i, str)]  # initialize and tools/list
    assert len(own) == 2 and len(set(own)) == 2 and all(i.startswith("gateway-") for i in own)


def test_the_relay_stops_at_the_answer_and_filters_with_the_sdk_client(gateway, raw):
    gw = gateway(raw_config(raw.url.removesuffix("/v1") + "/mcp"))

    async def scenario() -> list[str]:
        async with mcp_client(gw.url + "/mcp/raw", mode="legacy") as client:
            return [t.name for t in (await client.list_tools()).tools]

    assert asyncio.run(scenario()) == ["echo"]


@pytest.mark.parametrize(
    ("rid", "method"),
    [
        ("other-json", "tools/list"),
        ("other-sse", "tools/list"),
        ("escaped", "tools/list"),
        ("duplicate", "tools/list"),
        ("unreadable-sse", "tools/list"),
        ("ping-tools", "ping"),
        (7, "tools/list"),
    ],
)
def test_every_result_that_carries_tools_is_filtered_whatever_its_id(gateway, raw, rid, method):
    gw = gateway(raw_config(raw.url.removesuffix("/v1") + "/mcp"))
    with httpx2.Client(timeout=20) as http:
        r = http.post(gw.url + "/mcp/raw", json=_rpc(rid, method), headers=ACCEPT)
        body = _body(r)
    assert r.status_code == 200, body
    assert b"secret" not in body and b"denied by the config" not in body
    if rid != "unreadable-sse":
        assert b'"echo"' in body  # the allowed tool is still there
    if rid == "other-sse":
        assert b"id: e1\n" in body  # the event's own fields survive the rewrite


def test_an_unreadable_json_answer_that_may_carry_tools_is_refused(gateway, raw):
    gw = gateway(raw_config(raw.url.removesuffix("/v1") + "/mcp"))
    with httpx2.Client(timeout=20) as http:
        r = http.post(gw.url + "/mcp/raw", json=_rpc("unreadable-json"), headers=ACCEPT)
    assert r.status_code == 502 and b"secret" not in r.content
    assert r.json()["error"]["code"] == "mcp_bad_answer"


@pytest.mark.parametrize("path", ["/mcp/raw", "/mcp"])
@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "tools/list"},  # no id
        {"jsonrpc": "2.0", "id": None, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": None, "method": "tools/call", "params": {"name": "echo"}},
        {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "raw__echo"}},
        {"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": True, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": None, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "id": 3, "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 4},  # neither a request nor a response
        {"jsonrpc": "2.0", "id": None, "result": {}},
        {"jsonrpc": "2.0", "id": 5, "result": {}, "error": {"code": 1, "message": "both"}},
        {"jsonrpc": "2.0", "id": 6, "method": 7},
    ],
)
def test_a_request_without_a_string_or_integer_id_is_refused(gateway, raw, path, message):
    gw = gateway(raw_config(raw.url.removesuffix("/v1") + "/mcp"))
    with httpx2.Client(timeout=20) as http:
        r = http.post(gw.url + path, content=orjson.dumps(message), headers=ACCEPT)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["id"] is None and error["error"]["code"] == -32600
    assert raw.requests == []  # never forwarded


@pytest.mark.parametrize("path", ["/mcp/raw", "/mcp"])
def test_notifications_and_answers_of_the_client_still_pass(gateway, raw, path):
    gw = gateway(raw_config(raw.url.removesuffix("/v1") + "/mcp"))
    messages = [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "srv-1", "result": {}},
        {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "unreadable"}},
    ]
    with httpx2.Client(timeout=20) as http:
        for message in messages:
            r = http.post(gw.url + path, json=message, headers=ACCEPT)
            assert r.status_code == 202, r.text
