"""End to end: the official openai SDK → gateway → mock upstream (a separate process)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.support import async_openai_client, config_for, openai_client

MESSAGES = [{"role": "user", "content": "Tell me about gateways"}]


@pytest.fixture
def gw(gateway, mock_upstream):
    return gateway(config_for(mock_upstream.url + "/v1"))


def test_chat_json_sync(gw, mock_upstream):
    via = openai_client(gw.base_url, "sk-client")
    direct = openai_client(mock_upstream.url + "/v1", "x")
    got = via.chat.completions.create(model="mock-gpt-4o", messages=MESSAGES, temperature=0)
    want = direct.chat.completions.create(model="mock-gpt-4o", messages=MESSAGES, temperature=0)
    assert got.object == "chat.completion"
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].message.content
    assert got.usage is not None and got.usage.total_tokens == want.usage.total_tokens
    assert got.model == "mock-gpt-4o"


def test_chat_stream_sync_joins_to_upstream_text_and_relays_usage(gw, mock_upstream):
    via = openai_client(gw.base_url, "sk-client")
    direct = openai_client(mock_upstream.url + "/v1", "x")

    def collect(client: openai.OpenAI) -> tuple[str, list]:
        chunks = list(
            client.chat.completions.create(
                model="mock-gpt-4o",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks

    text, chunks = collect(via)
    want_text, want_chunks = collect(direct)
    assert text and text == want_text
    assert len(chunks) == len(want_chunks)
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0].choices == []
    assert usage_chunks[0].usage.completion_tokens == want_chunks[-1].usage.completion_tokens
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == "stop"


def test_async_client_chat_stream_completions_embeddings_models(gw, mock_upstream):
    async def main() -> None:
        via = async_openai_client(gw.base_url, "sk-client")
        direct = async_openai_client(mock_upstream.url + "/v1", "x")
        async with via, direct:
            chat = await via.chat.completions.create(model="mock-gpt-4o-mini", messages=MESSAGES)
            assert chat.choices[0].message.content

            stream = await via.chat.completions.create(
                model="mock-gpt-4o-mini", messages=MESSAGES, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            assert text == chat.choices[0].message.content

            comp = await via.completions.create(
                model="mock-gpt-4o", prompt="Say this", max_tokens=5
            )
            want = await direct.completions.create(
                model="mock-gpt-4o", prompt="Say this", max_tokens=5
            )
            assert comp.choices[0].text == want.choices[0].text
            assert comp.usage is not None and comp.usage.completion_tokens == 5

            cstream = await via.completions.create(
                model="mock-gpt-4o", prompt="Say this", max_tokens=5, stream=True
            )
            ctext = "".join([c.choices[0].text async for c in cstream if c.choices])
            assert ctext == want.choices[0].text

            emb = await via.embeddings.create(model="mock-embedding-3-small", input=["one", "two"])
            want_emb = await direct.embeddings.create(
                model="mock-embedding-3-small", input=["one", "two"]
            )
            assert len(emb.data) == 2 and len(emb.data[0].embedding) == 1536
            assert emb.data[1].embedding == want_emb.data[1].embedding

            models = await via.models.list()
            ids = {m.id async for m in models}
            assert {"mock-gpt-4o", "mock-gpt-4o-mini", "mock-embedding-3-small"} <= ids

    asyncio.run(main())


def test_sync_completions_embeddings_models(gw):
    via = openai_client(gw.base_url, "sk-client")
    comp = via.completions.create(model="mock-gpt-4o", prompt="hello", max_tokens=3)
    assert len(comp.choices[0].text.split()) == 3
    emb = via.embeddings.create(model="mock-embedding-3-small", input="hello", dimensions=8)
    assert len(emb.data[0].embedding) == 8
    assert "mock-gpt-4o" in {m.id for m in via.models.list()}


def test_upstream_error_is_passed_through_with_status_and_body(gw):
    via = openai_client(gw.base_url, "sk-client")
    with pytest.raises(openai.BadRequestError) as info:
        via.chat.completions.create(model="mock-status-400", messages=MESSAGES)
    assert info.value.status_code == 400
    # the body is the upstream's own (the mock's error type), not re-wrapped by the gateway
    assert info.value.body["type"] == "mock_error"
    assert "answered 400" in info.value.message
