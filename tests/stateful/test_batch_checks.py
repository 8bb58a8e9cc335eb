"""Batches, checked like live calls and metered in every spelling (docs/spec.md §24, §26).

An OpenAI batch's input lines are read before the batch starts, for every key with auth on —
not only keys with a budget: a line naming a model the key may not call is a 403, one naming
another tenant's (or an unknown) object a 404, one a reader could take two ways a 400; and
nothing reaches a backend's ``/batches``. A batch's results are debited however the read is
spelled: an Anthropic client's headers on an OpenAI output file, a trailing slash, an escape."""

from __future__ import annotations

import hashlib

import anthropic
import httpx2
import openai
import orjson
import pytest

from tests.stateful.support import (
    KEY_ONE,
    KEY_TWO,
    TWO_TENANTS,
    anthropic_pair_toml,
    batch_jsonl,
    ended_batch,
    message_requests,
    pair_toml,
)
from tests.stateful.test_batch_spend import (
    KEY_BUDGET,
    claude_cost,
    keys,
    openai_cost,
    run_openai_batch,
    spent,
)
from tests.support import gateway_config

KEY_GPT_ONLY = "sk-gpt-test-only"
GPT_ONLY = f"""
[[auth.keys]]
tenant = "t2"
sha256 = "{hashlib.sha256(KEY_GPT_ONLY.encode()).hexdigest()}"
models = ["gpt-test"]
"""


def _line(body: dict[str, object]) -> bytes:
    line = {"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps(line) + b"\n"


def _file_part(file_id: str) -> dict[str, object]:
    part = {"type": "file", "file": {"file_id": file_id}}
    return {"model": "gpt-test", "messages": [{"role": "user", "content": [part]}]}


def test_batch_lines_are_checked_like_live_calls_for_every_key(gateway, mock_pair):
    a, b = mock_pair
    gw = gateway(gateway_config(TWO_TENANTS + GPT_ONLY + pair_toml(a.url, b.url)))
    with (
        openai.OpenAI(base_url=gw.base_url, api_key=KEY_ONE, max_retries=0) as one,
        openai.OpenAI(base_url=gw.base_url, api_key=KEY_GPT_ONLY, max_retries=0) as narrow,
        openai.OpenAI(base_url=gw.base_url, api_key=KEY_TWO, max_retries=0) as two,
    ):
        theirs = one.files.create(file=("t.txt", b"secret"), purpose="user_data").id
        cases = {
            "model_not_allowed": batch_jsonl(2).replace(b'"gpt-test"', b'"gpt-other"', 1),
            "not_found": _line(_file_part(theirs)),
            "unknown": _line(_file_part("file-never-made-through-here")),
            "ambiguous_batch_line": _line(_file_part(theirs)).replace(
                b'"file_id":', b'"file_id":"file-x","file_id":'
            ),
        }
        for want, jsonl in cases.items():
            made = narrow.files.create(file=("in.jsonl", jsonl), purpose="batch")
            with pytest.raises(openai.APIStatusError) as exc:
                narrow.batches.create(
                    input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
                )
            body = exc.value.body
            assert isinstance(body, dict)
            assert body["code"] == ("not_found" if want == "unknown" else want), body
        assert not a.objects.batches.batches and not b.objects.batches.batches
        # a key whose globs allow every model, and lines naming the tenant's own file, run
        mine = two.files.create(file=("m.txt", b"mine"), purpose="user_data").id
        jsonl = batch_jsonl(1).replace(b'"gpt-test"', b'"gpt-other"') + _line(_file_part(mine))
        made = two.files.create(file=("ok.jsonl", jsonl), purpose="batch")
        batch = two.batches.create(
            input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.id in a.objects.batches.batches or batch.id in b.objects.batches.batches


@pytest.mark.parametrize("spelling", ["anthropic-headers", "trailing-slash"])
def test_an_openai_batch_s_results_are_debited_in_every_spelling(gateway, mock_pair, spelling):
    a, b = mock_pair
    gw = gateway(gateway_config(keys(1.0) + pair_toml(a.url, b.url)))
    with openai.OpenAI(base_url=gw.base_url, api_key=KEY_BUDGET, max_retries=0) as client:
        output_id = run_openai_batch(client, 2)
        headers = {"authorization": f"Bearer {KEY_BUDGET}"}
        path = f"/v1/files/{output_id}/content"
        if spelling == "anthropic-headers":  # as the Anthropic SDK (Files API) reads a file
            headers |= {"anthropic-version": "2023-06-01", "anthropic-beta": "files-api-2025-04-14"}
        else:
            path += "/"
        r = httpx2.get(gw.url + path, headers=headers, timeout=30)
        assert r.status_code == 200 and len(r.text.splitlines()) == 2
        want = openai_cost(r.text)
        assert want > 0 and spent(gw) == pytest.approx(want, rel=1e-6)
        assert client.files.content(output_id).text == r.text  # the documented spelling: once
        assert spent(gw) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("tail", ["results/", "result%73", "%72esults"])
def test_an_anthropic_batch_s_results_are_debited_in_every_spelling(gateway, mock_pair, tail):
    a, b = mock_pair
    gw = gateway(gateway_config(keys(1.0) + anthropic_pair_toml(a.url, b.url)))
    with anthropic.Anthropic(base_url=gw.url, api_key=KEY_BUDGET, max_retries=0) as client:
        batch = client.messages.batches.create(requests=message_requests(2))  # type: ignore[arg-type]
        ended_batch(client, batch.id)
        r = httpx2.get(
            f"{gw.url}/v1/messages/batches/{batch.id}/{tail}",
            headers={"x-api-key": KEY_BUDGET, "anthropic-version": "2023-06-01"},
            timeout=30,
        )
        assert r.status_code == 200 and len(r.text.splitlines()) == 2
        want = claude_cost(list(client.messages.batches.results(batch.id)))
        assert want > 0 and spent(gw) == pytest.approx(want, rel=1e-6)
