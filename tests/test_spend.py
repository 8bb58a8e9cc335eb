"""Spend end to end (docs/spec.md §20): prices, the cost of every protocol's answers, budgets
with reservations, shared by replicas through a real ``redis-server``, the spend API.

The gateway runs as a real server (in a thread, or as its own process for the replica tests);
the clients are the official openai and anthropic SDKs; the upstream reports usage figures the
test chooses (tests/spend_support.py), so every cost below is worked out by the test itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import anthropic
import openai
import pytest

from tests.model_api_support import traced
from tests.otlp_receiver import OTLPReceiver
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
from tests.support import GatewayServer, ScriptedUpstream, gateway_config

MSG = [{"role": "user", "content": "How much does this cost?"}]


def routes(upstream_url: str, extra: str = "") -> str:
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

[logging]
access_log = "all"
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
