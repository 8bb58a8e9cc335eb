"""MCP requests as the OpenTelemetry MCP conventions describe them (docs/spec.md §23): the
attributes, a message's ``params._meta.traceparent`` as the parent, and a client's GET stream
recorded as what it is on ``/mcp`` and ``/mcp/{server}`` alike."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.mcp.mcp_support import McpUpstream, mcp_config
from tests.model_api_support import traced
from tests.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.spend_support import sample, samples
from tests.support import gateway_config

ACCEPT = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


@pytest.fixture
def mcp_upstream() -> Iterator[McpUpstream]:
    server = McpUpstream().start()
    yield server
    server.stop()


def _ids() -> tuple[str, str]:
    return f"{random.getrandbits(128):032x}", f"{random.getrandbits(64):016x}"


def _session(http: httpx2.Client, url: str) -> str:
    r = http.post(url, json=INIT, headers=ACCEPT)
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    r = http.post(url, json=done, headers={**ACCEPT, "mcp-session-id": sid})
    assert r.status_code == 202
    return sid


def _call(http: httpx2.Client, url: str, sid: str, meta: dict[str, Any], header: str) -> None:
    msg = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "add", "arguments": {"a": 1, "b": 2}, "_meta": meta},
    }
    headers = {**ACCEPT, "mcp-session-id": sid, "traceparent": header}
    r = http.post(url, json=msg, headers=headers)
    assert r.status_code == 200 and "3" in r.text


def _root(receiver: OTLPReceiver, trace_id: str) -> tuple[ReceivedSpan, ReceivedSpan]:
    spans = receiver.wait_for(
        lambda ss: any(s.trace_id == trace_id and s.name == "tools/call add" for s in ss)
    )
    (root,) = [s for s in spans if s.trace_id == trace_id and s.name == "POST /mcp/up"]
    (client,) = [s for s in spans if s.trace_id == trace_id and s.name == "tools/call add"]
    return root, client


def test_meta_traceparent_is_the_parent_and_the_header_a_link(gateway, mcp_upstream):
    meta_trace, meta_span = _ids()
    head_trace, head_span = _ids()
    header = f"00-{head_trace}-{head_span}-01"
    with OTLPReceiver("http") as receiver:
        gw = gateway(mcp_config(mcp_upstream.mcp_url, extra=traced(receiver.endpoint)))
        url = gw.url + "/mcp/up"
        with httpx2.Client(timeout=10) as http:
            sid = _session(http, url)
            state = "vendor=abc"
            meta = {"traceparent": f"00-{meta_trace}-{meta_span}-01", "tracestate": state}
            _call(http, url, sid, meta, header)
            root, client = _root(receiver, meta_trace)
            # an invalid one is ignored: the header's context stays the parent
            bad = {"traceparent": f"00-{'z' * 32}-{meta_span}-01"}
            _call(http, url, sid, bad, header)
            fallback, _ = _root(receiver, head_trace)
    assert root.parent_span_id == meta_span and root.trace_state == state
    assert root.links == [(head_trace, head_span, {})]  # the HTTP request's own context
    assert client.parent_span_id == root.span_id
    a = root.attributes
    assert a["mcp.method.name"] == "tools/call" and a["jsonrpc.request.id"] == "7"
    assert a["mcp.session.id"] == sid and a["mcp.protocol.version"] == "2025-06-18"
    assert a["gen_ai.tool.name"] == "add" and a["gen_ai.operation.name"] == "execute_tool"
    assert a["network.transport"] == "tcp" and a["network.protocol.name"] == "http"
    assert "error.type" not in a
    c = client.attributes
    assert c["mcp.method.name"] == "tools/call" and c["server.port"] == mcp_upstream.port
    # the tool server's parent is the gateway's CLIENT span, in the caller's trace
    sent = mcp_upstream.calls("tools/call")[0].json()["params"]["_meta"]
    assert sent["traceparent"] == f"00-{meta_trace}-{client.span_id}-01"
    assert fallback.parent_span_id == head_span and fallback.links == []


def test_meta_traceparent_is_not_trusted_when_incoming_contexts_are_not(gateway, mcp_upstream):
    meta_trace, meta_span = _ids()
    with OTLPReceiver("http") as receiver:
        extra = traced(receiver.endpoint) + "trust_incoming = false\n"
        gw = gateway(mcp_config(mcp_upstream.mcp_url, extra=extra))
        url = gw.url + "/mcp/up"
        with httpx2.Client(timeout=10) as http:
            sid = _session(http, url)
            meta = {"traceparent": f"00-{meta_trace}-{meta_span}-01"}
            _call(http, url, sid, meta, f"00-{meta_trace}-{meta_span}-01")
        spans = receiver.wait_for(lambda ss: any(s.name == "tools/call add" for s in ss))
    (root,) = [s for s in spans if s.name == "POST /mcp/up" and "gen_ai.tool.name" in s.attributes]
    assert root.trace_id != meta_trace and root.parent_span_id is None


BUILTIN_ONLY = """
[[backends]]
name = "mock"
url = "mock://"

[[routes]]
models = ["*"]
backends = ["mock"]

[[mcp_servers]]
name = "builtin"
url = "mock://"

[logging]
access_log = "all"

[ui]
enabled = true
"""


def test_a_get_no_server_streams_for_is_answered_alike_and_is_no_failure(gateway, access_lines):
    gw = gateway(gateway_config(BUILTIN_ONLY))
    answers = []
    with httpx2.Client(timeout=10) as http:
        for url in (gw.url + "/mcp/builtin", gw.url + "/mcp"):
            sid = _session(http, url)
            r = http.get(url, headers={**ACCEPT, "mcp-session-id": sid})
            answers.append((r.status_code, r.headers["allow"], r.json()["error"]["code"]))
    assert answers == [(405, "POST, DELETE", -32000)] * 2
    deadline = time.monotonic() + 5  # a request's line is written as it ends, after its answer
    while len(gets := [x for x in access_lines if x["method"] == "GET"]) < 2:
        assert time.monotonic() < deadline, gets
        time.sleep(0.01)
    assert [x["path"] for x in gets] == ["/mcp/builtin", "/mcp"]
    for line in gets:
        assert line["status"] == 405 and line["mcp"]["status"] == "no_stream"
        assert "error" not in line["mcp"] and line.get("error_type") is None
    for server in ("builtin", "*"):
        labels = {"server": server, "method": "stream", "tool": ""}
        assert sample(gw.url, "gateway_mcp_requests_total", **labels, status="no_stream") == 1
    errors = [k for k in samples(gw.url, "gateway_errors_total") if ("status_code", "405") in k]
    assert errors == []
    # the live view lists them, and not among the failures
    api = gw.url + "/_gateway/api/requests"
    listed = httpx2.get(api, timeout=5).json()["requests"]
    assert sum(r["path"] in ("/mcp", "/mcp/builtin") and r["method"] == "GET" for r in listed) == 2
    failures = httpx2.get(api, params={"status": "error"}, timeout=5).json()["requests"]
    assert [r for r in failures if r["method"] == "GET"] == []


def test_a_stream_the_client_ends_is_no_499(gateway, mcp_upstream, access_lines):
    gw = gateway(mcp_config(mcp_upstream.mcp_url, extra='[logging]\naccess_log = "all"\n'))
    with httpx2.Client(timeout=10) as http:
        for url in (gw.url + "/mcp/up", gw.url + "/mcp"):
            sid = _session(http, url)
            headers = {**ACCEPT, "accept": "text/event-stream", "mcp-session-id": sid}
            with http.stream("GET", url, headers=headers) as r:
                assert r.status_code == 200  # the server's stream (on /mcp: the merged ones)
            path = url[len(gw.url) :]
            for _ in range(100):  # the client closed it: its line is written at the end
                if any(x["method"] == "GET" and x["path"] == path for x in access_lines):
                    break
                time.sleep(0.05)
    gets = [x for x in access_lines if x["method"] == "GET"]
    assert [x["path"] for x in gets] == ["/mcp/up", "/mcp"]
    for line in gets:
        assert line["status"] == 200 and line["mcp"]["status"] == "ok"
        assert line["mcp"]["ended_by"] == "client" and "error" not in line["mcp"]
