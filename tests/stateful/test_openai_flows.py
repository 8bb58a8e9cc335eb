"""The stateful OpenAI APIs through one route over two backends that each hold their own
objects (docs/spec.md §24), driven by the official ``openai`` SDK: files → batches → results,
uploads, conversations with ``responses.create(conversation=…)``, vector stores.

The route balances 1:1 (weighted), so consecutive creates land on both backends; every call
naming an object must reach the backend holding it, or the mock answers 404 and the SDK raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.stateful.support import MockBackend, batch_jsonl, done_batch, pair_toml
from tests.support import GatewayServer, gateway_config


@pytest.fixture
def client(gateway, mock_pair) -> Iterator[openai.OpenAI]:
    a, b = mock_pair
    server: GatewayServer = gateway(gateway_config(pair_toml(a.url, b.url)))
    with openai.OpenAI(base_url=server.base_url, api_key="sk-any", max_retries=0) as c:
        yield c


def holder(pair: tuple[MockBackend, MockBackend], file_id: str) -> str:
    return "a" if file_id in pair[0].objects.files.files else "b"


def test_files_batches_and_results_reach_the_backend_holding_them(client, mock_pair):
    held_by = []
    for round_ in range(4):
        lines = batch_jsonl(3)
        created = client.files.create(file=("in.jsonl", lines), purpose="batch")
        held_by.append(holder(mock_pair, created.id))
        assert client.files.retrieve(created.id).bytes == len(lines)
        assert client.files.content(created.id).read() == lines  # streamed back unchanged
        batch = client.batches.create(
            input_file_id=created.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        done = done_batch(client, batch.id)
        assert done.request_counts is not None and done.request_counts.completed == 3
        assert done.output_file_id is not None
        # the output file was made by the batch's backend; the gateway learnt it from the batch
        assert holder(mock_pair, done.output_file_id) == held_by[-1]
        results = [
            json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()
        ]
        assert [r["custom_id"] for r in results] == ["req-0", "req-1", "req-2"], round_
        assert all(r["response"]["status_code"] == 200 for r in results)
        assert results[0]["response"]["body"]["object"] == "chat.completion"
    assert set(held_by) == {"a", "b"}  # the balancer used both: each call followed its file


def test_a_cancelled_batch_and_a_deleted_file_reach_their_owner(client, mock_pair):
    for _ in range(2):
        created = client.files.create(file=("in.jsonl", batch_jsonl(1)), purpose="batch")
        batch = client.batches.create(
            input_file_id=created.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert client.batches.cancel(batch.id).status in ("cancelled", "completed")
        assert client.files.delete(created.id).deleted is True
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(created.id)
    assert not any(f.purpose == "batch" for m in mock_pair for f in m.objects.files.files.values())


def test_lists_merge_every_backend_of_the_route(client, mock_pair):
    ids = {client.files.create(file=(f"f{i}.txt", b"x"), purpose="user_data").id for i in range(4)}
    assert {holder(mock_pair, i) for i in ids} == {"a", "b"}
    listed = client.files.list()
    assert {f.id for f in listed.data} == ids
    created = [f.created_at for f in listed.data]
    assert created == sorted(created, reverse=True)  # newest first across backends


def test_an_upload_in_parts_becomes_a_file_on_its_backend(client, mock_pair):
    for _ in range(2):
        up = client.uploads.create(
            bytes=6, filename="two.txt", mime_type="text/plain", purpose="user_data"
        )
        first = client.uploads.parts.create(upload_id=up.id, data=b"abc")
        second = client.uploads.parts.create(upload_id=up.id, data=b"def")
        done = client.uploads.complete(upload_id=up.id, part_ids=[first.id, second.id])
        assert done.file is not None
        assert client.files.content(done.file.id).read() == b"abcdef"


def test_a_conversation_s_responses_reach_the_backend_holding_it(client, mock_pair):
    for _ in range(2):
        conv = client.conversations.create(items=[{"role": "user", "content": "hello"}])
        for turn in range(3):
            answer = client.responses.create(
                model="gpt-test", input=f"turn {turn}", conversation=conv.id
            )
            assert answer.output_text
        texts = [
            item.content[0].text  # type: ignore[union-attr]
            for item in client.conversations.items.list(conv.id).data
        ]
        assert texts == ["hello", "turn 0", "turn 1", "turn 2"]
        assert client.conversations.retrieve(conv.id).id == conv.id
        assert client.conversations.delete(conv.id).deleted is True
        with pytest.raises(openai.NotFoundError):
            client.conversations.retrieve(conv.id)


def test_vector_stores_go_where_their_files_are(client, mock_pair):
    for word in ("apples", "pears"):
        file = client.files.create(
            file=("doc.txt", f"all about {word}".encode()), purpose="assistants"
        )
        store = client.vector_stores.create(name=word, file_ids=[file.id])
        assert store.file_counts.completed == 1
        hits: Any = client.vector_stores.search(store.id, query=word)
        assert [h.file_id for h in hits.data] == [file.id]
        more = client.files.create(file=("more.txt", word.encode()), purpose="assistants")
        if holder(mock_pair, more.id) == holder(mock_pair, file.id):
            client.vector_stores.files.create(store.id, file_id=more.id)
            assert len(client.vector_stores.files.list(store.id).data) == 2
        assert client.vector_stores.delete(store.id).deleted is True


def test_one_call_naming_files_on_two_backends_is_a_clear_400(client, mock_pair):
    files = [client.files.create(file=("d.txt", b"d"), purpose="assistants") for _ in range(2)]
    assert {holder(mock_pair, f.id) for f in files} == {"a", "b"}
    with pytest.raises(openai.BadRequestError) as exc:
        client.vector_stores.create(name="s", file_ids=[f.id for f in files])
    body = exc.value.body
    assert isinstance(body, dict) and body["code"] == "objects_on_different_backends"


def test_an_answer_too_long_to_read_passes_through_unread(client, mock_pair, monkeypatch):
    made = client.files.create(file=("d.txt", b"d"), purpose="user_data")
    monkeypatch.setattr("gateway.hops.held.HOLD_LIMIT", 8)
    assert client.files.retrieve(made.id).id == made.id
    assert {f.id for f in client.files.list().data} <= {made.id}  # one backend's page, as sent
