"""Stateful calls in traces (docs/spec.md §24): the SERVER span named by the path's shape with
its ids replaced, and a streamed upload's and download's sizes on it — exported to a real OTLP
receiver."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.otlp_receiver import OTLPReceiver
from tests.stateful.support import batch_jsonl, pair_toml
from tests.support import gateway_config


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver("http") as r:
        yield r


def test_spans_name_the_call_and_carry_the_bytes_streamed(gateway, mock_pair, receiver):
    a, b = mock_pair
    tracing = f"""
[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
sample_ratio = 1.0
schedule_delay_ms = 50
"""
    server = gateway(gateway_config(pair_toml(a.url, b.url, extra=tracing)))
    data = batch_jsonl(40)
    with openai.OpenAI(base_url=server.base_url, api_key="sk-any", max_retries=0) as client:
        made = client.files.create(file=("in.jsonl", data), purpose="batch")
        assert client.files.content(made.id).read() == data
        client.files.retrieve(made.id)
    names = {"POST /v1/files", "GET /v1/files/{file_id}/content", "GET /v1/files/{file_id}"}
    spans = receiver.wait_for(lambda ss: names <= {s.name for s in ss if s.kind == "SERVER"})
    roots = {s.name: s for s in spans if s.kind == "SERVER"}
    upload = roots["POST /v1/files"].attributes
    assert upload["http.request.body.size"] > len(data)  # the multipart form around the file
    assert "http.response.body.size" not in upload
    download = roots["GET /v1/files/{file_id}/content"].attributes
    assert download["http.response.body.size"] == len(data)
    assert "http.request.body.size" not in roots["GET /v1/files/{file_id}"].attributes
    client_spans = [s for s in spans if s.kind == "CLIENT"]
    assert {s.attributes.get("gateway.backend") for s in client_spans} <= {"a", "b"}
