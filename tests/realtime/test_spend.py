"""Spend of a realtime session (docs/spec.md §19, §20): each ``response.done`` is priced from its
own usage (cached input at its own price), the cost shows on the response's span, the session's
root span, the access log and ``gateway_cost_usd_total``, and budgets are debited per response.

The upstream (tests/realtime_support.py) answers every response with 10 input tokens (4 of them
cached) and 5 output tokens; at 2.50 / 1.25 / 10.00 USD per 1M tokens one response costs
(6 x 2.50 + 4 x 1.25 + 5 x 10.00) / 10^6 = 70 micro-USD.
"""

from __future__ import annotations

import asyncio
import time

import httpx2
import pytest
from websockets.asyncio.client import connect

from tests.model_api_support import traced
from tests.realtime.test_handshake import CLIENT_KEY, keyed, refused, run, ws_url
from tests.realtime.test_telemetry import (  # noqa: F401 - fixtures
    _once_closed,
    _value,
    receiver,
    two_responses,
)
from tests.support import config_for

PRICES = """
[[prices]]
models = ["gpt-realtime"]
input = 2.50
cached_input = 1.25
output = 10.00
"""
ONE = 70e-6


def test_each_response_is_priced_and_the_session_costs_their_sum(
    gateway,
    realtime_upstream,
    receiver,  # noqa: F811
    access_lines,
):
    up = realtime_upstream(deltas=2)
    extra = PRICES + '[logging]\naccess_log = "all"\n' + traced(receiver.endpoint)
    gw = gateway(config_for(up.url, extra=extra))
    run(two_responses(gw))
    up.wait_ended()
    spans = receiver.wait_for(lambda s: any(x.name == "GET /v1/realtime" for x in s))
    responses = [s for s in spans if s.name == "realtime response"]
    assert [r.attributes["gateway.cost_usd"] for r in responses] == pytest.approx([ONE, ONE])
    (root,) = [s for s in spans if s.name == "GET /v1/realtime"]
    assert root.attributes["gateway.cost_usd"] == pytest.approx(2 * ONE)
    assert root.attributes["gen_ai.usage.cache_read.input_tokens"] == 8
    text = _once_closed(gw.url, 1)
    assert _value(text, "gateway_cost_usd_total", tenant="-") == pytest.approx(2 * ONE)
    deadline = time.monotonic() + 10
    while not any(x["path"] == "/v1/realtime" for x in access_lines):
        assert time.monotonic() < deadline, "no access-log line for the session"
        time.sleep(0.01)
    (line,) = [x for x in access_lines if x["path"] == "/v1/realtime"]
    assert line["cost_usd"] == pytest.approx(2 * ONE)


def test_responses_of_a_model_without_a_price_are_counted_unpriced(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))
    run(two_responses(gw))
    up.wait_ended()
    text = _once_closed(gw.url, 1)
    assert _value(text, "gateway_unpriced_requests_total") == 2.0
    with pytest.raises(AssertionError):  # nothing priced: no cost series at all
        _value(text, "gateway_cost_usd_total")


def _spent(gw) -> float:
    r = httpx2.get(
        gw.url + "/_gateway/api/spend", headers={"authorization": f"Bearer {CLIENT_KEY}"}
    )
    assert r.status_code == 200, r.text
    (row,) = r.json()["keys"]
    return float(row["spent_usd"])


def test_a_keys_budget_is_debited_per_response(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(keyed(up.url, extra="admin = true\nbudget_usd = 1.0\n" + PRICES))
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}

    async def session() -> str | None:
        async with connect(ws_url(gw), additional_headers=headers, open_timeout=10) as ws:
            remaining = ws.response.headers.get("x-gateway-budget-remaining-usd")
            await ws.recv()
            await ws.send('{"type":"response.create"}')
            while b'"response.done"' not in (await ws.recv()).encode():
                pass
            # debited as the response ended, while the session is still open
            deadline = time.monotonic() + 10
            while _spent(gw) == 0:
                assert time.monotonic() < deadline, "the response was not debited"
                await asyncio.sleep(0.01)
            assert _spent(gw) == pytest.approx(ONE)
        return remaining

    assert run(session()) == "1.000000"
    up.wait_ended()
    _once_closed(gw.url, 1)  # the gateway finished the session
    assert _spent(gw) == pytest.approx(ONE)  # the session's end debits nothing more


def test_a_key_with_a_budget_may_not_open_a_session_of_a_model_without_a_price(
    gateway, realtime_upstream
):
    up = realtime_upstream()
    gw = gateway(keyed(up.url, extra="budget_usd = 1.0\n"))  # no [[prices]]
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
    status, body, _ = run(refused(ws_url(gw), additional_headers=headers))
    assert status == 403 and body["error"]["code"] == "model_not_priced"
    assert up.handshakes == []  # refused before any upstream handshake


def test_a_spent_budget_refuses_the_next_session_before_the_upgrade(gateway, realtime_upstream):
    up = realtime_upstream()
    # one response costs 70 micro-USD: the first session spends the whole 60 micro-USD budget
    gw = gateway(keyed(up.url, extra="admin = true\nbudget_usd = 0.00006\n" + PRICES))
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}

    async def one_response() -> None:
        async with connect(ws_url(gw), additional_headers=headers, open_timeout=10) as ws:
            await ws.recv()
            await ws.send('{"type":"response.create"}')
            while b'"response.done"' not in (await ws.recv()).encode():
                pass

    run(one_response())
    up.wait_ended()
    deadline = time.monotonic() + 10
    while _spent(gw) < ONE:  # its response debited
        assert time.monotonic() < deadline, "the response was not debited"
        time.sleep(0.01)
    status, body, got = run(refused(ws_url(gw), additional_headers=headers))
    assert status == 429
    assert body["error"]["code"] == "budget_exceeded"
    assert body["error"]["type"] == "insufficient_quota"
    assert int(got["retry-after"]) >= 1
    assert len(up.handshakes) == 1  # the refused session never reached the upstream
    assert _spent(gw) == pytest.approx(ONE)  # the refused session spent nothing
