"""Anthropic Message Batches and Files (beta) through a route of two ``provider =
"anthropic"`` backends that each hold their own (docs/spec.md §24), driven by the official
``anthropic`` SDK: a batch goes where its requests' model is served, and every later call
naming it — retrieve, results (JSONL, streamed), cancel, delete — reaches the backend holding
it; the ``results_url`` the SDK follows points at the gateway."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx2 as httpx
import pytest

from tests.stateful.support import anthropic_pair_toml, ended_batch, message_requests
from tests.support import GatewayServer, gateway_config


@pytest.fixture
def server(gateway, mock_pair) -> GatewayServer:
    a, b = mock_pair
    return gateway(gateway_config(anthropic_pair_toml(a.url, b.url)))


@pytest.fixture
def client(server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="sk-any", max_retries=0) as c:
        yield c


def test_message_batches_and_their_results_reach_the_backend_holding_them(
    client, server, mock_pair
):
    a, _ = mock_pair
    # one after the other: the 1:1 balancer puts them on both backends
    batches = [client.messages.batches.create(requests=message_requests(3)) for _ in range(4)]  # type: ignore[arg-type]
    held_by = {"a" if x.id in a.objects.message_batches.batches else "b" for x in batches}
    for batch in batches:
        done = ended_batch(client, batch.id)
        assert done.request_counts.succeeded == 3
        assert done.results_url == f"{server.url}/v1/messages/batches/{batch.id}/results"
        results = list(client.messages.batches.results(batch.id))
        assert [r.custom_id for r in results] == ["req-0", "req-1", "req-2"]
        assert all(r.result.type == "succeeded" for r in results)
        assert client.messages.batches.delete(batch.id).id == batch.id
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve(batch.id)
    assert held_by == {"a", "b"}


def test_a_cancelled_batch_reaches_its_owner_and_lists_merge_both_backends(client, mock_pair):
    ids = {client.messages.batches.create(requests=message_requests(1)).id for _ in range(4)}  # type: ignore[arg-type]
    cancelled = client.messages.batches.cancel(next(iter(ids)))
    assert cancelled.processing_status in ("canceling", "ended")
    assert {b.id for b in client.messages.batches.list()} == ids


def test_a_batch_naming_no_model_is_a_clear_400(server):
    answer = httpx.post(
        f"{server.url}/v1/messages/batches",
        json={"requests": [{"custom_id": "x", "params": {"max_tokens": 1}}]},
        headers={"x-api-key": "sk-any"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "model_required"


def test_anthropic_files_go_to_an_anthropic_route_and_back(server, mock_pair):
    beta = {"anthropic-beta": "files-api-2025-04-14", "x-api-key": "sk-any"}
    for n in range(2):
        data = f"file number {n}".encode()
        made = httpx.post(
            f"{server.url}/v1/files", files={"file": ("n.txt", data)}, headers=beta
        ).json()
        assert made["type"] == "file" and made["size_bytes"] == len(data)
        meta = httpx.get(f"{server.url}/v1/files/{made['id']}", headers=beta).json()
        assert meta["id"] == made["id"]
        content = httpx.get(f"{server.url}/v1/files/{made['id']}/content", headers=beta)
        assert content.content == data
        gone = httpx.delete(f"{server.url}/v1/files/{made['id']}", headers=beta)
        assert gone.status_code == 200


def test_the_anthropic_sdk_s_files_beta_through_two_backends(client, mock_pair):
    a, _ = mock_pair
    files = client.beta.files
    made = [files.upload(file=(f"n{n}.txt", f"file {n}".encode(), "text/plain")) for n in range(2)]
    assert {m.id in a.objects.files.files for m in made} == {True, False}  # on both backends
    for n, m in enumerate(made):
        assert files.retrieve_metadata(m.id).size_bytes == len(f"file {n}")
        assert files.download(m.id).read() == f"file {n}".encode()
    assert {f.id for f in files.list()} == {m.id for m in made}
    for m in made:
        files.delete(m.id)
    with pytest.raises(anthropic.NotFoundError):
        files.retrieve_metadata(made[0].id)
