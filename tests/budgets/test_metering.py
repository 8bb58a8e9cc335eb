"""The pieces of batch accounting (gateway/budgets/metering.py, docs/spec.md §24): lines found
as chunks pass, results priced per line at each model's batch price, a batch's worst case (its
input file's lines read by gateway/stateful/batch_checks.py)."""

from __future__ import annotations

import orjson
import pytest

from gateway.budgets import metering
from gateway.budgets.metering import Lines, ResultsTally, WorstCase
from gateway.budgets.spend import Prices
from gateway.config import PriceConfig
from gateway.errors import Forbidden
from gateway.stateful.batch_checks import BatchLines

PRICES = Prices(
    (
        PriceConfig(("gpt-a",), 2.0, 8.0, cached_input=1.0, batch_discount=0.25),
        PriceConfig(("claude-a",), 3.0, 15.0, cache_write=3.75),
    )
)


def test_lines_split_across_chunks_and_an_over_long_line_is_skipped(monkeypatch):
    monkeypatch.setattr(metering, "MAX_LINE_BYTES", 8)
    got: list[bytes] = []
    lines = Lines(got.append)
    for chunk in (b"ab", b"c\nxxxxx", b"xxxxxxxxx", b"xx\nde", b"f\n\n", b"gh"):
        lines.feed(chunk)
    lines.end()
    assert got == [b"abc", b"def", b"gh"]


def test_results_are_priced_per_line_at_each_model_s_batch_price():
    openai_lines = [
        {"response": {"body": {"model": "gpt-a", "usage": {
            "prompt_tokens": 1000, "completion_tokens": 100,
            "prompt_tokens_details": {"cached_tokens": 400}}}}},
        {"response": {"body": {"model": "gpt-a", "usage": {
            "input_tokens": 10, "output_tokens": 5}}}},  # a Responses line
        {"response": {"body": {"model": "gpt-unpriced", "usage": {"prompt_tokens": 9}}}},
        {"response": {"status_code": 400, "body": {"error": {"message": "no"}}}},
        {"custom_id": "an input line", "body": {"model": "gpt-a"}},
    ]  # fmt: skip
    tally = ResultsTally(PRICES, anthropic=False)
    data = b"".join(orjson.dumps(x) + b"\n" for x in openai_lines) + b"not json\n"
    for i in range(0, len(data), 7):  # chunk boundaries anywhere
        tally.lines.feed(data[i : i + 7])
    tally.lines.end()
    first = (600 * 2.0 + 400 * 1.0 + 100 * 8.0) / 1e6
    second = (10 * 2.0 + 5 * 8.0) / 1e6
    assert (tally.priced, tally.unpriced) == (2, 1)
    assert tally.cost_usd == pytest.approx((first + second) * 0.25)

    claude = ResultsTally(PRICES, anthropic=True)
    line = {"result": {"type": "succeeded", "message": {"model": "claude-a", "usage": {
        "input_tokens": 100, "cache_creation_input_tokens": 50, "output_tokens": 20}}}}  # fmt: skip
    claude.lines.feed(orjson.dumps(line))
    claude.lines.end()
    assert claude.cost_usd == pytest.approx((100 * 3.0 + 50 * 3.75 + 20 * 15.0) / 1e6 * 0.5)


def test_a_batch_s_worst_case_per_request_at_batch_prices():
    worst = WorstCase(PRICES, cap=None)
    chat = orjson.dumps(
        {"url": "/v1/chat/completions", "body": {"model": "gpt-a", "max_tokens": 50}}
    )
    embed = orjson.dumps({"url": "/v1/embeddings", "body": {"model": "gpt-a", "input": "x"}})
    lines = BatchLines(lambda model: model != "gpt-denied", worst)
    lines.line(chat)
    lines.line(embed)
    worst.add({"model": "nobody"}, 40)
    want_chat = (-(-len(chat) // 4) * 2.0 + 50 * 8.0) * 1000 * 0.25
    want_embed = -(-len(embed) // 4) * 2.0 * 1000 * 0.25
    assert worst.nano == pytest.approx(want_chat + want_embed, abs=2)
    assert worst.requests == 3 and worst.unpriced == {"nobody"}
    assert lines.denied == set()
    lines.line(orjson.dumps({"url": "/v1/chat/completions", "body": {"model": "gpt-denied"}}))
    assert lines.denied == {"gpt-denied"}
    with pytest.raises(Forbidden):
        lines.refuse()
    capped = WorstCase(PRICES, cap=10)
    capped.add({"model": "claude-a"}, 4)
    assert capped.nano == pytest.approx((1 * 3.0 + 10 * 15.0) * 1000 * 0.5, abs=1)
