"""Arize Phoenix reads the gateway's spans (docs/spec.md §7): a real Phoenix server
(:mod:`tests.phoenix_support`) receives them over OTLP/HTTP, and its own REST and GraphQL APIs
give back the LLM span with its model, its tokens and its cost, in either naming convention."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.phoenix_support import INSTALL_TIMEOUT_S, Phoenix
from tests.support import gateway_config, openai_client

#: installing Phoenix (only when .phoenix/ is missing) and starting it take this long at most
pytestmark = pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)


@pytest.fixture(scope="module")
def phoenix() -> Iterator[Phoenix]:
    with Phoenix() as server:
        yield server


def _spans_of(phoenix: Phoenix, trace_id: str) -> list[dict[str, Any]]:
    r = httpx2.get(phoenix.url + "/v1/projects/default/spans", params={"limit": 1000}, timeout=10)
    r.raise_for_status()
    return [s for s in r.json()["data"] if s["context"]["trace_id"] == trace_id]


def _spans(phoenix: Phoenix, trace_id: str) -> dict[str, dict[str, Any]]:
    """The trace's spans by name, once its model call's CLIENT span arrived."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = {s["name"]: s for s in _spans_of(phoenix, trace_id)}
        if "chat gpt-4o-mini" in found and "POST /v1/chat/completions" in found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"trace {trace_id} is not in Phoenix\n{phoenix.log()}")


@pytest.mark.parametrize("conventions", ["genai", "openinference"])
def test_phoenix_shows_the_llm_span_with_model_tokens_and_cost(gateway, phoenix, conventions):
    gw = gateway(
        gateway_config(
            f"""
[[backends]]
name = "mock"
url = "mock://"
provider = "openai"

[[routes]]
models = ["*"]
backends = ["mock"]

[tracing]
exporter = "otlp"
endpoint = "{phoenix.url}"
schedule_delay_ms = 50
conventions = "{conventions}"

[[prices]]
models = ["*"]
input = 2.0
output = 8.0
"""
        )
    )
    client = openai_client(gw.base_url)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello phoenix"}]
    )
    usage = raw.parse().usage
    client.close()
    assert usage is not None
    trace_id = raw.headers["traceresponse"].split("-")[1]
    spans = _spans(phoenix, trace_id)
    span = spans["chat gpt-4o-mini"]  # the model call's CLIENT span
    assert span["span_kind"] == "LLM"
    a = span["attributes"]
    assert a["llm.model_name"] == "gpt-4o-mini"  # Phoenix's own reading of either convention
    assert a["llm.token_count.prompt"] == usage.prompt_tokens
    assert a["llm.token_count.completion"] == usage.completion_tokens
    assert a["llm.token_count.total"] == usage.total_tokens
    ours = (usage.prompt_tokens * 2.0 + usage.completion_tokens * 8.0) / 1e6
    assert a["gateway.cost_usd"] == pytest.approx(ours)  # the gateway's price, on the span
    if conventions == "openinference":
        assert a["llm.cost.total"] == pytest.approx(ours)
        # the request is the chain the model call runs in (Phoenix counts one LLM call)
        assert spans["POST /v1/chat/completions"]["span_kind"] == "CHAIN"
    # Phoenix prices the span itself from its tokens and model (its own price table)
    node = phoenix.graphql(
        f'query {{ node(id: "{span["id"]}") {{ ... on Span {{ '
        f"costSummary {{ total {{ cost tokens }} prompt {{ tokens }} }} }} }} }}"
    )["node"]
    total = node["costSummary"]["total"]
    assert total["tokens"] == usage.total_tokens and total["cost"] > 0
    assert node["costSummary"]["prompt"]["tokens"] == usage.prompt_tokens
