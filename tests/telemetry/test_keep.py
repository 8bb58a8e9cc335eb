"""SPEC §7 ``[tracing] keep``: the slow, failed and cut requests are traced at any ratio, decided
as the request ends; the access log follows the same decision. Real sockets, the real OTLP
receiver."""

from __future__ import annotations

import asyncio
import random
import time

import httpx2
import openai
import orjson
import pytest

from gateway.config import ConfigError, build_config
from gateway.config.observability import keep_rule
from tests.otlp_receiver import OTLPReceiver
from tests.support import LAST_CHUNK, chat_chunk, chunk, config_for, http_response, sse_head

MSG = [{"role": "user", "content": "keep me"}]
FAST = 30


async def by_model(req, writer):
    """Answers by the request's model: slow (0.3 s), fail (500), cut (a stream cut short)."""
    model = orjson.loads(req.body)["model"]
    if model == "slow":
        await asyncio.sleep(0.3)
    if model == "fail":
        writer.write(http_response(500, b'{"error": {"message": "boom"}}'))
        return True
    if model == "cut":
        writer.write(sse_head() + chunk(chat_chunk("partial")))
        await writer.drain()
        writer.write(LAST_CHUNK)  # a clean end of body, but no data: [DONE]
        return True
    writer.write(http_response(200, b'{"id": "ok", "object": "chat.completion", "choices": []}'))
    return True


def kept_config(up_url: str, receiver: OTLPReceiver, keep: str, log: str = ""):
    return config_for(
        up_url,
        extra=f"""
[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
sample_ratio = 0.01
schedule_delay_ms = 50
keep = {keep}
[logging]
access_log = "sampled"
slow_ms = 60000
sample_ratio = 0.01
{log}
""",
    )


def roots(receiver: OTLPReceiver) -> dict[str, str]:
    """model → trace id of every exported root span."""
    return {
        s.attributes.get("gen_ai.request.model", ""): s.trace_id
        for s in receiver.spans
        if s.kind == "SERVER"
    }


def test_slow_failed_and_cut_requests_are_traced_at_ratio_001(
    gateway, upstream, receiver, access_lines
):
    gw = gateway(kept_config(upstream(by_model).url, receiver, '["error", "cut", "slow:200ms"]'))
    for i in range(FAST):
        r = httpx2.post(gw.base_url + "/chat/completions", json={"model": f"f{i}", "messages": MSG})
        assert r.status_code == 200
    assert (
        httpx2.post(
            gw.base_url + "/chat/completions", json={"model": "slow", "messages": MSG}
        ).status_code
        == 200
    )
    r = httpx2.post(gw.base_url + "/chat/completions", json={"model": "fail", "messages": MSG})
    assert r.status_code == 500
    client = openai.OpenAI(base_url=gw.base_url, api_key="sk-x", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model="cut", messages=MSG, stream=True):
            pass
    receiver.wait_for(lambda ss: {"slow", "fail", "cut"} <= set(roots(receiver)))
    traced = roots(receiver)
    # the upstream was told "not sampled" (the decision is made at the end) and the whole
    # tree is exported: root, hops and the CLIENT span
    for model in ("slow", "fail", "cut"):
        assert len(receiver.trace(traced[model])) >= 4
    root = {
        s.attributes.get("gen_ai.request.model"): s for s in receiver.spans if s.kind == "SERVER"
    }
    assert root["fail"].status_code == "ERROR" and root["cut"].status_code == "ERROR"
    assert root["slow"].attributes["gateway.request_time_ms"] >= 200
    fast = [m for m in traced if m.startswith("f")]
    assert len(fast) <= 3  # ratio 0.01 of 30: P(more than 3) < 1e-4
    by_rule = [m for m in ("slow", "fail", "cut") if not gw.app.tracing.sample(int(traced[m], 16))]
    assert gw.app.tracing.kept == len(by_rule)
    # the access log kept the same three (and its ratio draw, on the trace id, nothing else
    # that was not traced)
    logged = {line["model"]: line["trace_id"] for line in access_lines}
    for model in ("slow", "fail", "cut"):
        assert logged[model] == traced[model]
    for model, tid in logged.items():
        if model.startswith("f"):
            assert traced.get(model) == tid


@pytest.mark.parametrize("keep", ["[]", '["error"]'])
def test_a_rule_overrides_an_unsampled_parent(gateway, upstream, receiver, keep):
    gw = gateway(kept_config(upstream(by_model).url, receiver, keep))
    tid = f"{random.getrandbits(128):032x}"
    r = httpx2.post(
        gw.base_url + "/chat/completions",
        json={"model": "fail", "messages": MSG},
        headers={"traceparent": f"00-{tid}-{'1' * 16}-00"},
    )
    assert r.status_code == 500
    # a later request kept by its rule (or, without rules, none) shows the export ran
    r = httpx2.post(gw.base_url + "/chat/completions", json={"model": "slow", "messages": MSG})
    if keep == "[]":
        time.sleep(0.3)  # six export intervals
        assert receiver.trace(tid) == []
        assert gw.app.tracing.kept == 0
    else:
        spans = receiver.wait_for(lambda ss: any(s.trace_id == tid for s in ss))
        root = next(s for s in spans if s.trace_id == tid and s.kind == "SERVER")
        assert root.parent_span_id == "1" * 16  # still the parent's child
        assert gw.app.tracing.kept >= 1


@pytest.mark.parametrize(
    ("rule", "parsed"),
    [
        ("error", ("error", 0.0)),
        ("cut", ("cut", 0.0)),
        ("client_error", ("client_error", 0.0)),
        ("slow:1s", ("slow", 1.0)),
        ("slow:250ms", ("slow", 0.25)),
        ("slow:2m", ("slow", 120.0)),
    ],
)
def test_keep_rules_parse(rule, parsed):
    assert keep_rule(rule) == parsed


@pytest.mark.parametrize(
    "rule", ["errors", "slow", "slow:", "slow:1", "slow:-1s", "slow:xs", "cut:1s", "slow:nanms"]
)
def test_a_bad_keep_rule_is_a_config_error(rule):
    data = {
        "backends": [{"name": "a", "url": "http://127.0.0.1:9/v1"}],
        "routes": [{"models": ["*"], "backends": ["a"]}],
        "tracing": {"keep": ["error", rule]},
    }
    with pytest.raises(ConfigError) as info:
        build_config(data, {})
    assert any(e.startswith("tracing.keep[1]") for e in info.value.errors), info.value.errors
