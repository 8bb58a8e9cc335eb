"""Spend end to end (docs/spec.md §20): prices, the cost of every protocol's answers, budgets
with reservations, shared by replicas through a real ``redis-server``, the spend API.

The gateway runs as a real server (in a thread, or as its own process for the replica tests);
the clients are the official openai and anthropic SDKs; the upstream reports usage figures the
test chooses (tests/spend_support.py), so every cost below is worked out by the test itself.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anthropic
import httpx2
import openai
import orjson
import pytest

from tests.gateway_process import gateway_process
from tests.model_api_support import traced
from tests.otlp_receiver import OTLPReceiver
from tests.redis_support import RedisServer
from tests.spend_support import (
    CLAUDE,
    EMBED,
    GPT,
    PRICES,
    AccessLines,
    Figures,
    UsageUpstream,
    cost,
    sample,
)
from tests.support import GatewayServer, ScriptedUpstream, digest, gateway_config

MSG = [{"role": "user", "content": "How much does this cost?"}]


def routes(upstream_url: str, extra: str = "", log: bool = True) -> str:
    logging = '[logging]\naccess_log = "all"' if log else ""
    return f"""
[[backends]]
name = "up"
url = "{upstream_url}"
api_key_env = "TEST_BACKEND_KEY"

[[routes]]
name = "all"
models = ["*"]
backends = ["up"]
retries = 0

{logging}
{PRICES}
{extra}
"""


@pytest.fixture(scope="module")
def usage() -> Iterator[UsageUpstream]:
    state = UsageUpstream()
    server = ScriptedUpstream(state.handler()).start()
    state.url = server.url  # type: ignore[attr-defined]
    yield state
    server.stop()


@pytest.fixture(scope="module")
def priced(usage: UsageUpstream) -> Iterator[GatewayServer]:
    """Auth off: the cost of each protocol's answers."""
    gw = GatewayServer(gateway_config(routes(usage.url))).start()  # type: ignore[attr-defined]
    yield gw
    gw.stop()


@pytest.fixture
def lines() -> Iterator[AccessLines]:
    with AccessLines() as log:
        yield log


def oai(gw: GatewayServer, key: str = "sk-none") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)


def ant(gw: GatewayServer, key: str = "sk-none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


# ---------------------------------------------------------------- the cost of each protocol


def _chat(gw: GatewayServer) -> None:
    answer = oai(gw).chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=500)
    assert answer.usage.prompt_tokens_details.cached_tokens == 1000


def _chat_stream(gw: GatewayServer) -> None:
    chunks = list(
        oai(gw).chat.completions.create(
            model="o3-mini",
            messages=MSG,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 250


def _completions(gw: GatewayServer) -> None:
    assert oai(gw).completions.create(model="gpt-4o-mini", prompt="hi").usage.total_tokens


def _embeddings(gw: GatewayServer) -> None:
    r = oai(gw).embeddings.create(model="text-embedding-3-small", input="the same text")
    assert r.usage.prompt_tokens == 1200


def _responses(gw: GatewayServer) -> None:
    r = oai(gw).responses.create(model="gpt-4o", input="hi", max_output_tokens=500)
    assert r.usage.output_tokens_details.reasoning_tokens == 250


def _responses_stream(gw: GatewayServer) -> None:
    events = list(oai(gw).responses.create(model="o3", input="hi", stream=True))
    assert events[-1].type == "response.completed"


def _messages(gw: GatewayServer) -> None:
    m = ant(gw).messages.create(model="claude-sonnet-4", max_tokens=500, messages=MSG)
    assert (m.usage.cache_read_input_tokens, m.usage.cache_creation_input_tokens) == (1000, 150)


def _messages_stream(gw: GatewayServer) -> None:
    with ant(gw).messages.stream(model="claude-opus-4", max_tokens=500, messages=MSG) as s:
        final = s.get_final_message()
    assert final.usage.output_tokens == 300


CACHED_AND_REASONING = Figures(input=1200, cached=1000, output=300, reasoning=250)
ANTHROPIC_CACHE = Figures(input=1200, cached=1000, write=150, output=300)
CASES: dict[str, tuple[Callable[[GatewayServer], None], str, Figures, dict[str, float]]] = {
    "chat": (_chat, "gpt-4o", CACHED_AND_REASONING, GPT),
    "chat-stream": (_chat_stream, "o3-mini", CACHED_AND_REASONING, GPT),
    "completions": (_completions, "gpt-4o-mini", CACHED_AND_REASONING, GPT),
    "embeddings": (_embeddings, "text-embedding-3-small", Figures(1200, 0, 0, 0), EMBED),
    "responses": (_responses, "gpt-4o", CACHED_AND_REASONING, GPT),
    "responses-stream": (_responses_stream, "o3", CACHED_AND_REASONING, GPT),
    "messages": (_messages, "claude-sonnet-4", ANTHROPIC_CACHE, CLAUDE),
    "messages-stream": (_messages_stream, "claude-opus-4", ANTHROPIC_CACHE, CLAUDE),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_cost_of_every_protocol_from_its_own_usage_fields(case, usage, priced, lines):
    call, model, figures, price = CASES[case]
    usage.figures = figures
    want = cost(figures, price)
    labels = {"route": "all", "model": model, "tenant": "-"}
    before = sample(priced.url, "gateway_cost_usd_total", **labels)
    kinds = ("input", "cached_input", "cache_write", "output", "reasoning")
    tokens_before = {
        k: sample(priced.url, "gateway_tokens_total", model=model, kind=k) for k in kinds
    }
    call(priced)
    (line,) = lines.wait(1)
    assert line["cost_usd"] == pytest.approx(want, rel=1e-12, abs=0)
    expected_tokens = {
        "input": figures.input,
        "output": figures.output,
        "cached_input": figures.cached,
        "cache_write": figures.write,
        "reasoning": figures.reasoning,
    }
    logged = {k: v for k, v in expected_tokens.items() if v or k in ("input", "output")}
    if case == "embeddings":
        logged["output"] = None  # not reported: embeddings write no tokens
    assert line["tokens"] == logged
    got = sample(priced.url, "gateway_cost_usd_total", **labels) - before
    assert got == pytest.approx(want, rel=1e-9)
    for kind in kinds:
        delta = (
            sample(priced.url, "gateway_tokens_total", model=model, kind=kind) - tokens_before[kind]
        )
        assert delta == expected_tokens[kind], kind


def test_the_numbers_are_the_formula_of_the_spec():
    # 200 fresh + 1000 cache reads + 150 cache writes in, 300 out, at Claude's prices
    assert cost(ANTHROPIC_CACHE, CLAUDE) == pytest.approx(
        (50 * 3.0 + 1000 * 0.3 + 150 * 3.75 + 300 * 15.0) / 1e6
    )


def test_the_root_span_carries_the_cost(usage):
    usage.figures = CACHED_AND_REASONING
    with OTLPReceiver("http") as receiver:
        cfg = gateway_config(routes(usage.url, traced(receiver.endpoint)))  # type: ignore[attr-defined]
        gw = GatewayServer(cfg).start()
        try:
            raw = oai(gw).chat.completions.with_raw_response.create(model="gpt-4o", messages=MSG)
            trace_id = raw.headers["traceresponse"].split("-")[1]
            spans = receiver.wait_for(
                lambda spans: any(s.trace_id == trace_id and s.kind == "SERVER" for s in spans)
            )
        finally:
            gw.stop()
    (root,) = [s for s in spans if s.trace_id == trace_id and s.kind == "SERVER"]
    assert root.attributes["gateway.cost_usd"] == pytest.approx(cost(CACHED_AND_REASONING, GPT))


def test_a_model_without_a_price_has_no_cost_and_is_counted(usage, priced, lines):
    usage.figures = Figures()
    before = sample(priced.url, "gateway_unpriced_requests_total", model="llama-3-70b")
    oai(priced).chat.completions.create(model="llama-3-70b", messages=MSG)
    (line,) = lines.wait(1)
    assert line["cost_usd"] is None and line["tokens"] == {"input": 1000, "output": 100}
    assert sample(priced.url, "gateway_unpriced_requests_total", model="llama-3-70b") == before + 1
    assert not any(
        dict(labels).get("model") == "llama-3-70b"
        for labels in _all(priced, "gateway_cost_usd_total")
    )


def _all(gw: GatewayServer, name: str) -> list[frozenset[tuple[str, str]]]:
    from tests.spend_support import samples

    return list(samples(gw.url, name))


def test_a_cache_hit_costs_nothing(usage, lines):
    usage.figures = Figures()
    cfg = gateway_config(routes(usage.url, '[cache]\nbackend = "memory"'))  # type: ignore[attr-defined]
    gw = GatewayServer(cfg).start()
    try:
        labels = {"route": "all", "model": "gpt-4o", "tenant": "-"}
        for _ in range(2):
            oai(gw).chat.completions.create(model="gpt-4o", messages=MSG, temperature=0)
        first, second = lines.wait(2)
        total = sample(gw.url, "gateway_cost_usd_total", **labels)
    finally:
        gw.stop()
    assert (first["cache"], second["cache"]) == ("miss", "hit")
    assert first["cost_usd"] == pytest.approx(cost(Figures(), GPT))
    assert second["cost_usd"] == 0.0
    assert total == pytest.approx(first["cost_usd"])


# ---------------------------------------------------------------- budgets

KEY_A = "sk-spend-a-5d1e0c9b7f"
KEY_B = "sk-spend-b-8a2f61c03e"
KEY_OTHER = "sk-spend-other-3c9e1d"
KEY_ADMIN = "sk-spend-admin-7b4a20"
KEY_FREE = "sk-spend-free-19d0e6"
KEY_TPM = "sk-spend-tpm-4e7c2a"
#: what each budget test's upstream reports: 20 tokens in, 1000 out = $0.01005 at gpt-4o
CHEAP = Figures(input=20, output=1000)
SPENT = 10_050_000  # nano-USD of one CHEAP answer
BODY = orjson.dumps({"model": "gpt-4o", "messages": MSG, "max_tokens": 1000})
#: what one such request reserves: its body's bytes / 4 at the input price, 1000 at output
RESERVED = -(-len(BODY) // 4) * 2500 + 1000 * 10_000


def keys_toml(
    upstream_url: str, extra: str = "", key_a: str = "", tenant: str = "", log: bool = True
) -> str:
    return routes(
        upstream_url,
        f"""
[auth]
mode = "keys"
{extra}

[[auth.tenants]]
name = "team-a"
{tenant}

[[auth.keys]]
tenant = "team-a"
sha256 = "{digest(KEY_A)}"
{key_a}

[[auth.keys]]
tenant = "team-a"
sha256 = "{digest(KEY_B)}"

[[auth.keys]]
tenant = "team-b"
sha256 = "{digest(KEY_OTHER)}"
budget_usd = 100.0

[[auth.keys]]
tenant = "ops"
sha256 = "{digest(KEY_ADMIN)}"
admin = true
budget_usd = 100.0

[[auth.keys]]
tenant = "free"
sha256 = "{digest(KEY_FREE)}"

[[auth.keys]]
tenant = "tpm"
sha256 = "{digest(KEY_TPM)}"
tpm = 1000
""",
        log,
    )


def post(gw: GatewayServer, key: str, body: bytes = BODY, path: str = "/chat/completions"):
    return httpx2.post(
        gw.base_url + path,
        content=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=30,
    )


@pytest.fixture
def budgeted(usage: UsageUpstream) -> Iterator[Callable[..., GatewayServer]]:
    """Factory: a gateway with keys and budgets in front of the usage upstream."""
    started: list[GatewayServer] = []

    def start(**kw: str) -> GatewayServer:
        usage.figures = CHEAP
        usage.hold = None
        usage.deaf = False
        gw = GatewayServer(gateway_config(keys_toml(usage.url, **kw))).start()  # type: ignore[attr-defined]
        started.append(gw)
        return gw

    yield start
    usage.hold = None
    usage.deaf = False
    for gw in started:
        gw.stop()


def _remaining(r: httpx2.Response) -> int:
    return round(float(r.headers["x-gateway-budget-remaining-usd"]) * 1e9)


def test_a_spent_budget_is_429_insufficient_quota_with_spent_budget_and_reset(budgeted, lines):
    gw = budgeted(key_a='budget_usd = 0.05\nbudget_period = "day"')
    client = oai(gw, KEY_A)
    remaining = []
    for _ in range(4):  # 4 x $0.01005 spent; each reserved ~$0.01006 first
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=MSG, max_tokens=1000
        )
        remaining.append(_remaining(raw))
        lines.wait(len(remaining))  # its end is settled before the next one
    assert remaining == [50_000_000 - i * SPENT for i in range(4)]
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=1000)
    err, headers = info.value.body, info.value.response.headers
    assert (err["type"], err["code"], err["param"]) == (
        "insufficient_quota",
        "budget_exceeded",
        None,
    )
    midnight = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT00:00:00Z")
    assert err["message"].startswith(
        f"key team-a/{digest(KEY_A)[:12]} spent $0.0402 of $0.05 today; resets {midnight}"
    )
    assert "this request may cost up to $0.01" in err["message"]
    assert KEY_A not in err["message"] and digest(KEY_A) not in err["message"]
    until_midnight = datetime.fromisoformat(midnight).timestamp() - time.time()
    assert until_midnight - 5 <= int(headers["retry-after"]) <= until_midnight + 5
    assert headers["x-should-retry"] == "true"
    assert _remaining(info.value.response) == 50_000_000 - 4 * SPENT
    assert usage_arrivals_after(gw) == 4  # the refused one never went upstream


def usage_arrivals_after(gw: GatewayServer) -> int:
    """Requests the gateway sent upstream (from its own metrics)."""
    return int(
        sum(
            v
            for labels, v in _samples(gw, "gateway_requests_total").items()
            if dict(labels).get("status_code") == "200"
        )
    )


def _samples(gw: GatewayServer, name: str) -> dict[frozenset[tuple[str, str]], float]:
    from tests.spend_support import samples

    return samples(gw.url, name)


def test_a_total_budget_never_resets_and_says_not_to_retry(budgeted, lines):
    gw = budgeted(key_a='budget_usd = 0.015\nbudget_period = "total"')
    assert post(gw, KEY_A).status_code == 200
    lines.wait(1)
    r = post(gw, KEY_A)
    assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"
    assert "spent $0.01005 of $0.015 in total; it does not reset" in r.json()["error"]["message"]
    assert r.headers["x-should-retry"] == "false" and "retry-after" not in r.headers


def concurrently(
    gw: GatewayServer, key: str, n: int, usage: UsageUpstream, body: bytes = BODY
) -> tuple[int, list[httpx2.Response]]:
    """``n`` requests at once, held at the upstream until every one was admitted or refused:
    (how many reached the upstream meanwhile, the answers)."""
    usage.hold = threading.Event()
    usage.arrived = 0
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(post, gw, key, body) for _ in range(n)]
        deadline = time.monotonic() + 15
        try:
            # refused ones are answered at once; admitted ones wait at the upstream
            while usage.arrived + sum(f.done() for f in futures) < n:
                assert time.monotonic() < deadline, "requests neither admitted nor refused"
                time.sleep(0.01)
            time.sleep(0.2)  # nothing more arrives
            reached = usage.arrived
        finally:
            usage.hold.set()
        return reached, [f.result() for f in futures]


def spend_of(gw: GatewayServer) -> dict[str, Any]:
    r = httpx2.get(gw.url + "/_gateway/api/spend", headers={"authorization": f"Bearer {KEY_ADMIN}"})
    assert r.status_code == 200, r.text
    return r.json()


def key_row(spend: dict[str, Any], key: str) -> dict[str, Any]:
    (row,) = [k for k in spend["keys"] if k["key"] == digest(key)[:12]]
    return row


def settled(gw: GatewayServer, key: str, spent: int) -> dict[str, Any]:
    """The key's budget once its requests' ends are all settled (Redis: in the background)."""
    deadline = time.monotonic() + 5
    while True:
        row = key_row(spend_of(gw), key)
        if row["reserved_usd"] == 0 and round(row["spent_usd"] * 1e9) == spent:
            return row
        assert time.monotonic() < deadline, row
        time.sleep(0.02)


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_twenty_concurrent_requests_never_pass_the_budget(budgeted, usage, store, request):
    extra = ""
    if store == "redis":
        # generous: this is about reservations in Redis, not about a slow Redis (a fallback)
        extra = f'redis_url = "{request.getfixturevalue("redis").url}"\ntimeout_ms = 2000'
    gw = budgeted(extra=extra, key_a='budget_usd = 0.05\nbudget_period = "week"')
    reached, answers = concurrently(gw, KEY_A, 20, usage)
    fits = 50_000_000 // RESERVED  # 4: never more in flight than the budget's worst case
    assert reached == fits
    assert sorted(r.status_code for r in answers) == [200] * fits + [429] * (20 - fits)
    for refused in (r for r in answers if r.status_code == 429):
        err = refused.json()["error"]
        assert (err["type"], err["code"]) == ("insufficient_quota", "budget_exceeded")
        assert "requests in flight hold the rest" in err["message"]
        assert refused.headers["retry-after"] == "1" and refused.headers["x-should-retry"] == "true"
    row = settled(gw, KEY_A, fits * SPENT)
    assert (row["budget_usd"], row["period"]) == (0.05, "week")
    assert row["spent_usd"] * 1e9 == pytest.approx(fits * SPENT)
    assert spend_of(gw)["shared"] is (store == "redis")


def test_tpm_reserves_so_concurrent_requests_cannot_overdraw_it(budgeted, usage):
    gw = budgeted()
    body = orjson.dumps({"model": "gpt-4o", "messages": MSG, "max_tokens": 200})
    estimate = -(-len(body) // 4) + 200
    usage.figures = Figures(input=20, output=200)
    reached, answers = concurrently(gw, KEY_TPM, 20, usage, body)
    assert reached == 1000 // estimate  # before reservations: all 20 (tpm was checked > 0)
    refused = [r for r in answers if r.status_code == 429]
    assert len(refused) == 20 - reached
    assert all(r.json()["error"]["code"] == "rate_limit_exceeded" for r in refused)
    assert all(f"may use up to {estimate} tokens" in r.json()["error"]["message"] for r in refused)


def test_a_tenant_budget_is_shared_by_its_keys(budgeted, lines):
    gw = budgeted(tenant='budget_usd = 0.03\nbudget_period = "month"')
    assert post(gw, KEY_A).status_code == 200
    lines.wait(1)
    r = post(gw, KEY_B)  # another key of team-a: the same budget
    assert r.status_code == 200 and _remaining(r) == 30_000_000 - SPENT
    lines.wait(2)
    for key in (KEY_A, KEY_B):
        r = post(gw, key)
        assert r.status_code == 429
        message = r.json()["error"]["message"]
        assert message.startswith("tenant 'team-a' spent $0.0201 of $0.03 this month; resets ")
    assert post(gw, KEY_OTHER).status_code == 200  # team-b has its own
    ratio = sample(gw.url, "gateway_budget_used_ratio", tenant="team-a")
    assert ratio == pytest.approx(2 * SPENT / 30_000_000)
    spend = spend_of(gw)
    (tenant,) = [t for t in spend["tenants"] if t["tenant"] == "team-a"]
    assert tenant["spent_usd"] * 1e9 == pytest.approx(2 * SPENT)
    assert tenant["budget_usd"] == 0.03 and tenant["resets_at"].endswith("-01T00:00:00Z")


def test_a_key_with_a_budget_cannot_spend_around_it(budgeted, usage):
    gw = budgeted(key_a="budget_usd = 1.0")
    usage.arrived = 0
    # passthrough paths are not metered: refused, unless the key is an admin key (files and
    # batches are metered per batch: docs/spec.md §24)
    r = httpx2.get(gw.base_url + "/vector_stores", headers={"authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "budget_passthrough"
    # and models without a price would cost it nothing
    r = post(gw, KEY_A, orjson.dumps({"model": "llama-3-70b", "messages": MSG}))
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_priced"
    assert usage.arrived == 0
    for key in (KEY_ADMIN, KEY_FREE):  # an admin key with a budget; a key without one
        r = httpx2.get(gw.base_url + "/files", headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 200
    # reading a stored response spends nothing: open to a key with a budget (its own
    # response: with auth on another id is a 404, docs/spec.md §26)
    made = post(gw, KEY_A, orjson.dumps({"model": "gpt-4o", "input": "hi"}), "/responses")
    assert made.status_code == 200 and made.json()["id"] == "resp_s"
    r = httpx2.get(gw.base_url + "/responses/resp_s", headers={"authorization": f"Bearer {KEY_A}"})
    assert r.status_code == 200
    assert usage.arrived == 4


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_an_answer_that_reports_no_usage_costs_its_reservation_everywhere(
    budgeted, usage, lines, stream
):
    """One figure: what the budget is charged is what the access log, the span and
    ``gateway_cost_usd_total`` say (the reservation, for an answer without usage)."""
    with OTLPReceiver("http") as receiver:
        gw = budgeted(key_a="budget_usd = 1.0", extra=traced(receiver.endpoint))
        usage.deaf = True  # asked for usage (docs/spec.md §20), it sends none
        raw = oai(gw, KEY_A).chat.completions.with_raw_response.create(
            model="gpt-4o", messages=MSG, max_tokens=1000, stream=stream
        )
        answer = raw.parse()
        if stream:
            assert list(answer)[-1].usage is None  # the upstream ignored include_usage
        else:
            assert answer.usage is None
        (line,) = lines.wait(1)
        body = {"model": "gpt-4o", "messages": MSG, "max_tokens": 1000, "stream": stream}
        charged = -(-len(orjson.dumps(body)) // 4) * 2500 + 1000 * 10_000  # what the SDK sent
        row = settled(gw, KEY_A, charged)  # the budget keeps its worst case...
        assert round(row["remaining_usd"] * 1e9) == 1_000_000_000 - charged
        assert round(line["cost_usd"] * 1e9) == charged  # ...and so does every figure
        metric = sample(
            gw.url, "gateway_cost_usd_total", route="all", model="gpt-4o", tenant="team-a"
        )
        assert round(metric * 1e9) == charged
        trace_id = raw.headers["traceresponse"].split("-")[1]
        spans = receiver.wait_for(
            lambda spans: any(s.trace_id == trace_id and s.kind == "SERVER" for s in spans)
        )
    (root,) = [s for s in spans if s.trace_id == trace_id and s.kind == "SERVER"]
    assert round(root.attributes["gateway.cost_usd"] * 1e9) == charged


def test_the_spend_api_is_for_admins_and_never_shows_a_key(budgeted):
    gw = budgeted(key_a="budget_usd = 2.5", tenant="budget_usd = 10")
    assert post(gw, KEY_A).status_code == 200
    url = gw.url + "/_gateway/api/spend"
    assert httpx2.get(url).status_code == 401
    r = httpx2.get(url, headers={"authorization": f"Bearer {KEY_B}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
    r = httpx2.get(url, headers={"authorization": f"Bearer {KEY_ADMIN}"})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    body = r.text
    for key in (KEY_A, KEY_B, KEY_OTHER, KEY_ADMIN, KEY_FREE):
        assert key not in body and digest(key) not in body and digest(key)[:32] not in body
    spend = r.json()
    assert [t["tenant"] for t in spend["tenants"]] == ["team-a"]
    assert {(k["tenant"], k["key"]) for k in spend["keys"]} == {
        ("team-a", digest(KEY_A)[:12]),
        ("team-b", digest(KEY_OTHER)[:12]),
        ("ops", digest(KEY_ADMIN)[:12]),
    }
    row = settled(gw, KEY_A, SPENT)
    assert set(row) == {
        "tenant", "key", "period", "period_start", "resets_at",
        "budget_usd", "spent_usd", "reserved_usd", "remaining_usd",
    }  # fmt: skip
    assert (row["budget_usd"], row["period"]) == (2.5, "month")


# ---------------------------------------------------------------- replicas on one Redis


def _ask(port: int, key: str = KEY_A) -> int:
    return httpx2.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        content=BODY,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=30,
    ).status_code


def _settled_in(redis: RedisServer, key: str) -> tuple[int, int]:
    """(spent, reserved) of a key's budget as Redis has it, once no reservation is left."""
    name = ("gateway:spend:v1:{team-a}:key:" + digest(key)[:32]).encode()
    deadline = time.monotonic() + 5
    while True:
        reserved = int(redis.command(b"HGET " + name + b" r") or 0)
        if reserved == 0:
            return int(redis.command(b"HGET " + name + b" p") or 0), reserved
        assert time.monotonic() < deadline, "a reservation was never settled"
        time.sleep(0.02)


def test_two_replicas_share_one_budget_through_redis(tmp_path, usage, redis):
    usage.figures, usage.hold = CHEAP, None
    cfg = keys_toml(
        usage.url,  # type: ignore[attr-defined]
        extra=f'redis_url = "{redis.url}"\ntimeout_ms = 2000',
        key_a="budget_usd = 0.05",
        log=False,
    )
    with gateway_process(tmp_path, cfg) as one, gateway_process(tmp_path, cfg) as two:
        codes = []
        for i in range(8):  # alternate: each replica alone would allow 4
            codes.append(_ask((one, two)[i % 2].port))
            _settled_in(redis, KEY_A)
    assert codes == [200] * 4 + [429] * 4
    assert _settled_in(redis, KEY_A) == (4 * SPENT, 0)


def _metric(port: int, name: str) -> float:
    from tests.spend_support import sample as sample_at

    return sample_at(f"http://127.0.0.1:{port}", name)


def test_redis_killed_mid_run_each_replica_spends_at_most_what_it_last_saw_left(
    tmp_path, usage, redis
):
    """The documented bound: while Redis is away a replica admits against what Redis last told
    it was spent plus its own spending since; the budget is overspent by at most what each
    replica other than the first saw left. No crash, no answer but 200 or 429."""
    usage.figures, usage.hold = CHEAP, None
    budget = 100_000_000  # $0.10
    cfg = keys_toml(
        usage.url,  # type: ignore[attr-defined]
        extra=f'redis_url = "{redis.url}"\ntimeout_ms = 200',
        key_a="budget_usd = 0.10",
        log=False,
    )
    with gateway_process(tmp_path, cfg) as one, gateway_process(tmp_path, cfg) as two:
        seen = {}
        for port in (one.port, two.port, one.port):  # three through Redis
            assert _ask(port) == 200
            seen[port] = _settled_in(redis, KEY_A)[0]  # what its settlement was told
        assert seen == {one.port: 3 * SPENT, two.port: 2 * SPENT}
        redis.kill()
        admitted = {one.port: 0, two.port: 0}
        for _ in range(10):
            for port in (one.port, two.port):
                code = _ask(port)
                assert code in (200, 429), code
                admitted[port] += code == 200
        for port in (one.port, two.port):
            assert _metric(port, "gateway_ratelimit_fallback") == 1
            assert _ask(port, KEY_FREE) == 200  # still serving
    # each admitted while what it saw spent + its own spending since + one reservation fit
    for port, admitted_here in admitted.items():
        assert admitted_here == (budget - seen[port] - RESERVED) // SPENT + 1
    total = 3 * SPENT + sum(admitted.values()) * SPENT
    assert total <= budget + (budget - 3 * SPENT) + (seen[one.port] - seen[two.port])


# ---------------------------------------------------------------- the example prices


@pytest.mark.parametrize(
    ("model", "prices"),
    [
        ("gpt-4o-mini-2024-07-18", (0.15, 0.075, 0.15, 0.60)),  # not gpt-4o's
        ("gpt-4o-2024-08-06", (2.50, 1.25, 2.50, 10.00)),
        ("gpt-5-mini-2025-08-07", (0.25, 0.025, 0.25, 2.00)),
        ("o3-mini", (1.10, 0.55, 1.10, 4.40)),
        ("text-embedding-3-small", (0.02, 0.02, 0.02, 0.0)),
        ("claude-opus-4-5-20251101", (5.00, 0.50, 6.25, 25.00)),
        ("claude-opus-4-1-20250805", (15.00, 1.50, 18.75, 75.00)),
        ("claude-sonnet-4-5-20250929", (3.00, 0.30, 3.75, 15.00)),
        ("claude-3-5-haiku-20241022", (0.80, 0.08, 1.00, 4.00)),
    ],
)
def test_the_example_prices_match_the_more_specific_pattern_first(model, prices):
    from pathlib import Path

    from gateway.budgets.spend import Prices
    from gateway.config import load_config

    path = Path(__file__).resolve().parent.parent / "config/examples/prices.toml"
    price = Prices(load_config(path, env={}).prices).of(model)
    assert price is not None, model
    assert (price.input, price.cached_input, price.cache_write, price.output) == prices


def test_a_soak_through_redis_stalls_ends_with_the_ledger_equal_to_the_priced_lines(
    usage, lines, caplog
):
    """Two replicas on one Redis that stalls (``DEBUG SLEEP``) twice while priced requests run
    concurrently the whole time: admissions and settlements time out (100 ms), run late in
    Redis, are counted per process and replayed. At the end Redis has spent exactly what the
    access log priced, and nothing is left reserved."""
    usage.figures, usage.hold = CHEAP, None
    caplog.set_level(logging.WARNING, "gateway.auth")
    with RedisServer(extra_args=("--enable-debug-command", "local")) as redis:
        extra = f'redis_url = "{redis.url}"\ntimeout_ms = 100'
        toml = keys_toml(usage.url, extra=extra, key_a="budget_usd = 100.0")
        one = GatewayServer(gateway_config(toml)).start()  # type: ignore[attr-defined]
        two = GatewayServer(gateway_config(toml)).start()  # type: ignore[attr-defined]
        try:
            done = threading.Event()

            def stalls() -> None:
                try:
                    for _ in range(2):
                        time.sleep(0.3)
                        with socket.create_connection(("127.0.0.1", redis.port), 5) as sock:
                            sock.sendall(b"DEBUG SLEEP 0.5\r\n")
                            sock.recv(16)  # +OK when the sleep is over
                    time.sleep(0.3)
                finally:
                    done.set()

            def client(n: int) -> list[int]:
                codes = []
                for _ in range(150):  # bounded; until the stalls are over
                    codes.append(post((one, two)[n % 2], KEY_A).status_code)
                    if done.is_set():
                        break
                return codes

            staller = threading.Thread(target=stalls)
            staller.start()
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                codes = [c for cs in pool.map(client, range(6)) for c in cs]
            staller.join()
            for gw in (one, two):  # traffic after the faults: each replica replays its ledger
                assert post(gw, KEY_A).status_code == 200
            assert set(codes) == {200}
            faults = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
            assert faults, "no request met a stalled Redis"
            priced = lines.wait(len(codes) + 2)
            charged = sum(round(line["cost_usd"] * 1e9) for line in priced)
            assert charged == (len(codes) + 2) * SPENT
            name = ("gateway:spend:v1:{team-a}:key:" + digest(KEY_A)[:32]).encode()
            deadline = time.monotonic() + 10
            while True:  # the last replays may still be on their way
                found = [int(redis.command(b"HGET " + name + f) or 0) for f in (b" p", b" r")]
                if found == [charged, 0] or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert found == [charged, 0]
        finally:
            one.stop()
            two.stop()
