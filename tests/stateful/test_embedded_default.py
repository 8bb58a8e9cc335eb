"""``gateway serve`` on the embedded default (one route to the in-process ``mock://`` backend)
runs the files → batches → results and Conversations flows end to end (docs/spec.md §24),
and answers bad stateful calls with clear OpenAI-shaped errors."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import openai
import pytest

from gateway.config import default_config_text
from tests.stateful.support import batch_jsonl, done_batch
from tests.support import GatewayServer, gateway_config


@pytest.fixture
def server(gateway) -> GatewayServer:
    return gateway(gateway_config(default_config_text()))


@pytest.fixture
def client(server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="sk-any", max_retries=0) as c:
        yield c


def test_files_batches_results_and_conversations_on_the_embedded_mock(client):
    file = client.files.create(file=("in.jsonl", batch_jsonl(2)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = done_batch(client, batch.id)
    assert done.output_file_id is not None
    lines = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in lines] == ["req-0", "req-1"]
    assert [b.id for b in client.batches.list().data] == [batch.id]
    conv = client.conversations.create()
    answer = client.responses.create(model="gpt-test", input="hello", conversation=conv.id)
    assert answer.output_text
    assert [i.type for i in client.conversations.items.list(conv.id).data] == ["message"]


def test_the_live_view_lists_stateful_calls_with_their_backend(server, client):
    file = client.files.create(file=("in.jsonl", batch_jsonl(1)), purpose="batch")
    client.files.content(file.id).read()
    records = httpx2.get(server.url + "/_gateway/api/requests").json()["requests"]
    seen = [(r["method"], r["path"], r["status"], r["backend"]) for r in records]
    assert ("POST", "/v1/files", 200, "mock") in seen
    assert ("GET", f"/v1/files/{file.id}/content", 200, "mock") in seen


def error_of(resp: httpx2.Response) -> dict[str, object]:
    error = resp.json()["error"]
    assert isinstance(error, dict) and {"message", "type", "code"} <= error.keys()
    return error


def test_bad_stateful_calls_are_clear_400s(server, client):
    base = server.base_url
    resp = httpx2.post(f"{base}/batches", content=b"{not json", headers={"content-type": "x"})
    assert resp.status_code == 400 and error_of(resp)["code"] == "invalid_json"
    resp = httpx2.post(f"{base}/conversations", json=[1, 2])
    assert resp.status_code == 400 and error_of(resp)["code"] == "invalid_body"
    resp = httpx2.get(f"{base}/files//content")
    assert resp.status_code in (400, 404) and error_of(resp)
    # an unknown id with auth off goes by the route rule: the backend's own 404 passes through
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_unknown")
