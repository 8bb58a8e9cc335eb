"""Realtime sessions in the live view (docs/spec.md §18, §19) over real sockets: the openai SDK's
``client.realtime.connect()`` through the gateway to the embedded default's mock backend; while
the session is open ``GET /_gateway/api/realtime`` lists it, once it closed its record in
``api/requests`` carries ``realtime``."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest

import gateway as gateway_pkg
from gateway.config import load_config
from tests.support import openai_client

#: USD per 1M tokens, so that each response has a cost
PRICES = """
[[prices]]
models = ["gpt-4o*"]
input = 2.50
output = 10.00
"""


def embedded_default(extra: str = "") -> Any:
    """The embedded default (mock:// in process, the view on) plus ``extra``."""
    text = (Path(gateway_pkg.__file__).parent / "default.toml").read_text()
    return load_config(text=text + extra)


def api(gw: Any, path: str) -> Any:
    r = httpx2.get(gw.url + "/_gateway/" + path, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def turn(conn: Any, prompt: str) -> tuple[list[str], Any]:
    """One text response on an open session: the event types the client got, and response.done."""
    conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": prompt}],
        }
    )
    conn.response.create()
    types: list[str] = []
    for event in conn:
        types.append(event.type)
        if event.type == "response.done":
            return types, event
    raise AssertionError(f"the session ended before response.done: {types}")


def finished(gw: Any, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
    """The session's record, once it is in the buffer (the session ends after the client's
    close reached the upstream and came back)."""
    deadline = time.monotonic() + timeout
    while True:
        records = [r for r in api(gw, "api/requests")["requests"] if r["id"] == request_id]
        if records:
            return records[0]
        assert time.monotonic() < deadline, f"no record of {request_id}"
        time.sleep(0.02)


def assert_response(seen: dict[str, Any], done: Any) -> None:
    """A response as the view shows it matches the client's response.done."""
    usage = done.response.usage
    assert seen["id"] == done.response.id
    assert seen["status"] == done.response.status == "completed"
    # TTFT runs from the client's response.create, the duration from response.created: either
    # may be the longer one
    assert seen["ttft_ms"] is not None and seen["ttft_ms"] > 0
    assert seen["duration_ms"] is not None and seen["duration_ms"] >= 0
    assert seen["input_tokens"] == usage.input_tokens
    assert seen["output_tokens"] == usage.output_tokens > 0
    assert seen["cost_usd"] == pytest.approx(
        (usage.input_tokens * 2.5 + usage.output_tokens * 10.0) / 1e6
    )


def test_an_open_session_is_listed_and_its_record_carries_the_session(gateway):
    gw = gateway(embedded_default(PRICES))
    assert api(gw, "api/realtime")["open"] == []
    request_id = f"lv-rt-{uuid.uuid4().hex[:8]}"
    client = openai_client(gw.base_url, "sk-x")
    received = 0
    with client.realtime.connect(
        model="gpt-4o", extra_headers={"x-request-id": request_id}, max_retries=0
    ) as conn:
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        types, first = turn(conn, "one two three")
        received += len(types)
        (live,) = api(gw, "api/realtime")["open"]
        assert live["request_id"] == request_id and live["open"] is True
        assert live["model"] == "gpt-4o" and live["backend"] == "mock"
        assert live["route"] == "default" and live["close_code"] is None
        assert live["messages_in"] == 3  # session.update, conversation.item.create, response.create
        assert live["messages_out"] == received  # every event the client got, response.done last
        assert live["responses_total"] == 1
        (response,) = live["responses"]
        assert_response(response, first)
        assert live["duration_ms"] > 0 and live["started_ns"] <= time.time_ns()
        types, second = turn(conn, "four five")
        received += len(types)
        (again,) = api(gw, "api/realtime")["open"]
        assert again["duration_ms"] > live["duration_ms"]
        assert [r["id"] for r in again["responses"]] == [first.response.id, second.response.id]
    rec = finished(gw, request_id)
    assert api(gw, "api/realtime")["open"] == []
    assert rec["path"] == "/v1/realtime" and rec["status"] == 101
    rt = rec["realtime"]
    assert rt["close_code"] == 1000 and rt["closed_by"] == "client"
    assert rt["messages_in"] == 5 and rt["messages_out"] == received
    assert rt["responses_total"] == 2
    assert [r["id"] for r in rt["responses"]] == [first.response.id, second.response.id]
    assert_response(rt["responses"][0], first)
    assert_response(rt["responses"][1], second)
    # the session's tokens and cost are its responses' (docs/spec.md §20)
    assert rec["tokens"]["output"] == sum(r["output_tokens"] for r in rt["responses"])
    assert rec["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rt["responses"]))
    # a session is no request for the latency percentiles: only the HTTP request below counts
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    body = api(gw, "api/requests")
    assert [r.get("realtime") is None for r in body["requests"]] == [True, False]
    assert body["stats"]["request_ms"]["count"] == 1


def test_sessions_open_at_once_are_listed_newest_first(gateway):
    gw = gateway(embedded_default())
    client = openai_client(gw.base_url, "sk-x")
    ids = [f"lv-rt-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    managers = [
        client.realtime.connect(model="gpt-4o", extra_headers={"x-request-id": i}, max_retries=0)
        for i in ids
    ]
    conns = []
    try:
        for manager in managers:
            conn = manager.__enter__()
            conns.append(conn)
            assert conn.recv().type == "session.created"  # accepted: registered by now
            time.sleep(0.002)
        listed = api(gw, "api/realtime")["open"]
        assert [s["request_id"] for s in listed] == ids[::-1]
        started = [s["started_ns"] for s in listed]
        assert started == sorted(started, reverse=True)
        assert all(s["messages_in"] == 0 and s["messages_out"] == 1 for s in listed)
    finally:
        for manager in managers[: len(conns)]:
            manager.__exit__(None, None, None)
    deadline = time.monotonic() + 10
    while api(gw, "api/realtime")["open"]:
        assert time.monotonic() < deadline, "closed sessions are still listed as open"
        time.sleep(0.02)


def test_two_open_sessions_with_one_request_id_are_both_listed(gateway):
    """Clients choose x-request-id: two sessions sharing one are two sessions, and the end of
    one does not hide the other."""
    gw = gateway(embedded_default())
    client = openai_client(gw.base_url, "sk-x")
    shared = f"lv-rt-same-{uuid.uuid4().hex[:6]}"
    first = client.realtime.connect(
        model="gpt-4o", extra_headers={"x-request-id": shared}, max_retries=0
    )
    second = client.realtime.connect(
        model="gpt-4o", extra_headers={"x-request-id": shared}, max_retries=0
    )
    conn = first.__enter__()
    try:
        assert conn.recv().type == "session.created"
        other = second.__enter__()
        try:
            assert other.recv().type == "session.created"
            assert [s["request_id"] for s in api(gw, "api/realtime")["open"]] == [shared] * 2
        finally:
            second.__exit__(None, None, None)
        deadline = time.monotonic() + 10
        while len(api(gw, "api/realtime")["open"]) != 1:
            assert time.monotonic() < deadline, "the first session is not listed alone"
            time.sleep(0.02)
    finally:
        first.__exit__(None, None, None)
