"""Stored objects belong to a tenant (docs/spec.md §24; issue 31, item 5): a file, batch,
conversation, vector store, response or Anthropic batch created with one tenant's key is a 404
to every other tenant's key — even though the gateway reaches the upstream with one shared
key — and lists show each tenant its own objects only. Driven by the ``openai`` and
``anthropic`` SDKs through a route of two backends that each hold their own objects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.stateful.support import (
    KEY_ONE,
    KEY_TWO,
    TWO_TENANTS,
    batch_jsonl,
    message_requests,
    mixed_toml,
)
from tests.support import GatewayServer, gateway_config


@pytest.fixture
def server(gateway, mock_pair) -> GatewayServer:
    a, b = mock_pair
    return gateway(gateway_config(TWO_TENANTS + mixed_toml(a.url, b.url)))


@pytest.fixture
def clients(server) -> Iterator[tuple[openai.OpenAI, openai.OpenAI]]:
    with (
        openai.OpenAI(base_url=server.base_url, api_key=KEY_ONE, max_retries=0) as one,
        openai.OpenAI(base_url=server.base_url, api_key=KEY_TWO, max_retries=0) as two,
    ):
        yield one, two


def gateway_404(exc: pytest.ExceptionInfo[Any]) -> bool:
    """The gateway's own 404 (the call never reached a backend)."""
    body = exc.value.body
    return isinstance(body, dict) and body.get("code") == "not_found"


def test_another_tenant_s_files_batches_and_conversations_are_404(clients, mock_pair):
    one, two = clients
    file = one.files.create(file=("in.jsonl", batch_jsonl(1)), purpose="batch")
    batch = one.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    conv = one.conversations.create()
    store = one.vector_stores.create(name="s", file_ids=[file.id])
    calls = [
        lambda: two.files.retrieve(file.id),
        lambda: two.files.content(file.id),
        lambda: two.files.delete(file.id),
        lambda: two.batches.retrieve(batch.id),
        lambda: two.batches.cancel(batch.id),
        lambda: two.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
        lambda: two.conversations.retrieve(conv.id),
        lambda: two.conversations.items.list(conv.id),
        lambda: two.responses.create(model="gpt-test", input="hi", conversation=conv.id),
        lambda: two.vector_stores.retrieve(store.id),
        lambda: two.vector_stores.create(name="t", file_ids=[file.id]),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as exc:
            call()
        assert gateway_404(exc)
    # the owner still reaches all of it
    assert one.files.retrieve(file.id).id == file.id
    assert one.batches.retrieve(batch.id).id == batch.id
    assert one.responses.create(model="gpt-test", input="hi", conversation=conv.id).output_text
    assert one.vector_stores.retrieve(store.id).id == store.id
    # lists: each tenant sees its own
    mine = two.files.create(file=("mine.txt", b"x"), purpose="user_data")
    assert {f.id for f in two.files.list().data} == {mine.id}
    assert file.id in {f.id for f in one.files.list().data}
    assert mine.id not in {f.id for f in one.files.list().data}
    assert [b.id for b in two.batches.list().data] == []


def test_another_tenant_s_responses_are_404(clients):
    one, two = clients
    made = one.responses.create(model="gpt-test", input="hi")
    with pytest.raises(openai.NotFoundError) as exc:
        two.responses.create(model="gpt-test", input="more", previous_response_id=made.id)
    assert gateway_404(exc)
    with pytest.raises(openai.NotFoundError) as exc:
        two.responses.retrieve(made.id)
    assert gateway_404(exc)
    follow = one.responses.create(model="gpt-test", input="more", previous_response_id=made.id)
    assert follow.output_text


def test_an_object_the_gateway_did_not_see_created_is_404_with_auth_on(clients, mock_pair):
    """It could be another tenant's, made through the same upstream key."""
    one, _ = clients
    a, b = mock_pair
    elsewhere = a.objects.files.add("x.txt", "user_data", b"made without the gateway")
    b.objects.files.files[elsewhere.id] = elsewhere
    with pytest.raises(openai.NotFoundError) as exc:
        one.files.content(elsewhere.id)
    assert gateway_404(exc)


def test_another_tenant_s_anthropic_batches_are_404(server):
    with (
        anthropic.Anthropic(base_url=server.url, api_key=KEY_ONE, max_retries=0) as one,
        anthropic.Anthropic(base_url=server.url, api_key=KEY_TWO, max_retries=0) as two,
    ):
        batch = one.messages.batches.create(requests=message_requests(1))  # type: ignore[arg-type]
        for call in (
            lambda: two.messages.batches.retrieve(batch.id),
            lambda: two.messages.batches.cancel(batch.id),
            lambda: two.messages.batches.delete(batch.id),
            lambda: list(two.messages.batches.results(batch.id)),
        ):
            with pytest.raises(anthropic.NotFoundError):
                call()
        assert [b.id for b in two.messages.batches.list()] == []
        assert one.messages.batches.retrieve(batch.id).id == batch.id
        assert [b.id for b in one.messages.batches.list()] == [batch.id]
