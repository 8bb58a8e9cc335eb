"""Batch accounting (docs/spec.md §24, §20), through a real gateway and two real mock backends
that each hold their own objects, driven by the ``openai`` and ``anthropic`` SDKs under a key
with a budget: a batch's results are priced as they are read — the sum of their lines' usage
at the model's price times ``batch_discount`` — and debited once, however often and through
whichever replica they are read; a batch whose worst case does not fit what is left is a 429
before it reaches a backend. The expected cost is worked out here from the JSONL the client
read, never from the gateway's own figures."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from tests.redis_support import RedisServer
from tests.spend_support import AccessLines, sample
from tests.stateful.support import (
    TWO_TENANTS,
    anthropic_pair_toml,
    batch_jsonl,
    done_batch,
    ended_batch,
    message_requests,
    pair_toml,
    until,
)
from tests.support import GatewayServer, gateway_config

KEY_BUDGET, KEY_ADMIN = "sk-batch-budget", "sk-batch-admin"
#: USD per 1M tokens; gpt-test at a 0.4 batch discount, claude-test at the default 0.5
GPT_IN, GPT_OUT, GPT_DISCOUNT = 2.0, 8.0, 0.4
CLAUDE_IN, CLAUDE_OUT = 3.0, 15.0
PRICES = f"""
[[prices]]
models = ["gpt-test"]
input = {GPT_IN}
output = {GPT_OUT}
batch_discount = {GPT_DISCOUNT}

[[prices]]
models = ["claude-test"]
input = {CLAUDE_IN}
output = {CLAUDE_OUT}
"""


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys(budget_usd: float, redis_url: str | None = None) -> str:
    """Two tenants (tests.stateful.support), plus a non-admin key of tenant t1 with a budget
    and an admin key to read the spend API."""
    auth = TWO_TENANTS
    if redis_url is not None:
        auth = auth.replace('mode = "keys"', f'mode = "keys"\nredis_url = "{redis_url}"')
    return (
        auth
        + f"""
[[auth.keys]]
tenant = "t1"
sha256 = "{_digest(KEY_BUDGET)}"
budget_usd = {budget_usd}
budget_period = "total"

[[auth.keys]]
tenant = "admin"
sha256 = "{_digest(KEY_ADMIN)}"
admin = true
"""
        + PRICES
    )


def spent(gw: GatewayServer) -> float:
    """What the spend API says the budgeted key spent."""
    r = httpx2.get(gw.url + "/_gateway/api/spend", headers={"authorization": f"Bearer {KEY_ADMIN}"})
    assert r.status_code == 200, r.text
    (row,) = [k for k in r.json()["keys"] if k["key"] == _digest(KEY_BUDGET)[:12]]
    return float(row["spent_usd"])


def openai_cost(jsonl: str) -> float:
    """The batch price of an output file's lines, from their usage."""
    total = 0.0
    for raw in jsonl.splitlines():
        body = json.loads(raw)["response"]["body"]
        assert body["model"] == "gpt-test"
        usage = body["usage"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        total += usage["prompt_tokens"] * GPT_IN + usage["completion_tokens"] * GPT_OUT
    return total / 1e6 * GPT_DISCOUNT


def run_openai_batch(client: openai.OpenAI, lines: int) -> str:
    """files → batches → the output file's id."""
    made = client.files.create(file=("in.jsonl", batch_jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = done_batch(client, batch.id)
    assert done.output_file_id is not None
    return done.output_file_id


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_an_openai_batch_is_debited_once_at_batch_prices_when_its_results_are_read(
    gateway, mock_pair
):
    a, b = mock_pair
    logged = '[logging]\naccess_log = "all"'
    gw = gateway(gateway_config(keys(1.0) + pair_toml(a.url, b.url, extra=logged)))
    with (
        AccessLines() as log,
        openai.OpenAI(base_url=gw.base_url, api_key=KEY_BUDGET, max_retries=0) as client,
    ):
        output_id = run_openai_batch(client, 3)
        assert spent(gw) == 0.0  # nothing is debited until the results are read
        first = client.files.content(output_id).text
        want = openai_cost(first)
        assert len(first.splitlines()) == 3
        assert spent(gw) == pytest.approx(want, rel=1e-6)
        second = client.files.content(output_id).text  # read again: no second debit
        assert second == first
        assert spent(gw) == pytest.approx(want, rel=1e-6)
        path = f"/v1/files/{output_id}/content"
        until(lambda: len([x for x in log.lines if x["path"] == path]) == 2 or None)
        reads = [x for x in log.lines if x["path"] == path]
        # the access log: the read that debited it shows the cost, the second read costs 0
        assert [x["cost_usd"] for x in reads] == [pytest.approx(want, rel=1e-6), 0.0]
    cost = sample(gw.url, "gateway_cost_usd_total", route="main", model="other", tenant="t1")
    assert cost == pytest.approx(want, rel=1e-6)  # the read that debited it, once
    down = sample(
        gw.url,
        "gateway_object_bytes_total",
        route="main",
        operation="files.content",
        direction="download",
    )
    assert down == 2 * len(first.encode())
    up = sample(
        gw.url,
        "gateway_object_bytes_total",
        route="main",
        operation="files.create",
        direction="upload",
    )
    assert up > len(batch_jsonl(3))  # the multipart form around the file
    count = sample(
        gw.url, "gateway_object_duration_seconds_count", route="main", operation="batches.create"
    )
    assert count == 1


def test_a_batch_whose_worst_case_exceeds_the_budget_left_is_429_before_any_backend(
    gateway, mock_pair
):
    """Each line may write 4096 tokens (no max_tokens, no cap): 3 lines at the batch price are
    about $0.0393 — more than a $0.03 budget; one line (about $0.0131) fits."""
    a, b = mock_pair
    gw = gateway(gateway_config(keys(0.03) + pair_toml(a.url, b.url)))
    with openai.OpenAI(base_url=gw.base_url, api_key=KEY_BUDGET, max_retries=0) as client:
        made = client.files.create(file=("in.jsonl", batch_jsonl(3)), purpose="batch")
        with pytest.raises(openai.RateLimitError) as exc:
            client.batches.create(
                input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        body = exc.value.body
        assert isinstance(body, dict) and body["code"] == "budget_exceeded"
        assert body["type"] == "insufficient_quota"
        assert "this request may cost up to $0.039" in body["message"]
        assert not a.objects.batches.batches and not b.objects.batches.batches
        small = client.files.create(file=("one.jsonl", batch_jsonl(1)), purpose="batch")
        batch = client.batches.create(
            input_file_id=small.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.id in a.objects.batches.batches or batch.id in b.objects.batches.batches
        assert spent(gw) == 0.0  # the check reserved nothing that stays
    with anthropic.Anthropic(base_url=gw.url, api_key=KEY_BUDGET, max_retries=0) as claude:
        big = message_requests(1)
        big[0]["params"]["max_tokens"] = 10_000  # 10k output tokens at $7.50/M: $0.075
        with pytest.raises(anthropic.RateLimitError):
            claude.messages.batches.create(requests=big)  # type: ignore[arg-type]
    assert not a.objects.message_batches.batches and not b.objects.message_batches.batches


def test_a_batch_naming_a_model_without_a_price_is_refused_to_a_budgeted_key(gateway, mock_pair):
    a, b = mock_pair
    gw = gateway(gateway_config(keys(1.0) + pair_toml(a.url, b.url)))
    line = batch_jsonl(1).replace(b'"gpt-test"', b'"gpt-unpriced"')
    with openai.OpenAI(base_url=gw.base_url, api_key=KEY_BUDGET, max_retries=0) as client:
        made = client.files.create(file=("in.jsonl", line), purpose="batch")
        with pytest.raises(openai.PermissionDeniedError) as exc:
            client.batches.create(
                input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "model_not_priced"
        with pytest.raises(openai.PermissionDeniedError) as exc:  # still unmetered: admin only
            client.vector_stores.create(name="s")
        assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "budget_passthrough"


def test_two_replicas_sharing_redis_debit_a_batch_once(gateway, mock_pair, redis):
    a, b = mock_pair
    config = gateway_config(keys(1.0, redis.url) + pair_toml(a.url, b.url))
    first, second = gateway(config), gateway(config)
    with (
        openai.OpenAI(base_url=first.base_url, api_key=KEY_BUDGET, max_retries=0) as one,
        openai.OpenAI(base_url=second.base_url, api_key=KEY_BUDGET, max_retries=0) as other,
    ):
        output_id = run_openai_batch(one, 2)
        text = other.files.content(output_id).text
        want = openai_cost(text)
        assert one.files.content(output_id).text == text
        assert other.files.content(output_id).text == text
        # 80 lines may cost about $1.05 at batch prices: more than the $1 budget has left
        big = one.files.create(file=("big.jsonl", batch_jsonl(80)), purpose="batch")
        with pytest.raises(openai.RateLimitError) as exc:
            other.batches.create(
                input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "budget_exceeded"
        assert len(a.objects.batches.batches) + len(b.objects.batches.batches) == 1
    for replica in (first, second):
        assert spent(replica) == pytest.approx(want, rel=1e-6)
    total = sum(
        sample(r.url, "gateway_cost_usd_total", route="main", model="other", tenant="t1")
        for r in (first, second)
    )
    assert total == pytest.approx(want, rel=1e-6)


def claude_cost(results: list[Any]) -> float:
    total = 0.0
    for r in results:
        assert r.result.type == "succeeded" and r.result.message.model == "claude-test"
        usage = r.result.message.usage
        assert usage.input_tokens > 0 and usage.output_tokens > 0
        total += usage.input_tokens * CLAUDE_IN + usage.output_tokens * CLAUDE_OUT
    return total / 1e6 * 0.5  # the default batch_discount


def test_anthropic_message_batch_results_are_debited_once_at_batch_prices(gateway, mock_pair):
    a, b = mock_pair
    gw = gateway(gateway_config(keys(1.0) + anthropic_pair_toml(a.url, b.url)))
    with anthropic.Anthropic(base_url=gw.url, api_key=KEY_BUDGET, max_retries=0) as client:
        batch = client.messages.batches.create(requests=message_requests(3))  # type: ignore[arg-type]
        ended_batch(client, batch.id)
        assert spent(gw) == 0.0
        results = list(client.messages.batches.results(batch.id))
        assert len(results) == 3
        want = claude_cost(results)
        assert spent(gw) == pytest.approx(want, rel=1e-6)
        assert claude_cost(list(client.messages.batches.results(batch.id))) == want
        assert spent(gw) == pytest.approx(want, rel=1e-6)
    cost = sample(gw.url, "gateway_cost_usd_total", route="claude", model="other", tenant="t1")
    assert cost == pytest.approx(want, rel=1e-6)
    down = sample(
        gw.url,
        "gateway_object_bytes_total",
        route="claude",
        operation="message_batches.results",
        direction="download",
    )
    assert down > 0
