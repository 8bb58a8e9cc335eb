"""Two gateway replicas sharing one real redis-server (docs/spec.md §24): an object created
through one replica is found — on its backend, for its tenant only — through the other. Each
replica balances on its own, so without the shared map calls would land on both backends."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import openai
import pytest
from redis import Redis

from tests.redis_support import RedisServer
from tests.stateful.support import (
    KEY_ONE,
    KEY_TWO,
    TWO_TENANTS,
    batch_jsonl,
    done_batch,
    ended_batch,
    message_requests,
    mixed_toml,
)
from tests.support import GatewayServer, gateway_config


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_two_replicas_sharing_redis_reach_every_object_s_backend(gateway, mock_pair, redis):
    a, b = mock_pair
    toml = TWO_TENANTS.replace('mode = "keys"', f'mode = "keys"\nredis_url = "{redis.url}"')
    config = gateway_config(toml + mixed_toml(a.url, b.url))
    replicas: list[GatewayServer] = [gateway(config), gateway(config)]
    with (
        openai.OpenAI(base_url=replicas[0].base_url, api_key=KEY_ONE, max_retries=0) as one,
        openai.OpenAI(base_url=replicas[1].base_url, api_key=KEY_ONE, max_retries=0) as other,
        openai.OpenAI(base_url=replicas[1].base_url, api_key=KEY_TWO, max_retries=0) as stranger,
    ):
        files = [
            one.files.create(file=(f"in{i}.jsonl", batch_jsonl(2)), purpose="batch")
            for i in range(2)
        ]
        assert {f.id in a.objects.files.files for f in files} == {True, False}  # both backends
        for file in files:
            batch = other.batches.create(
                input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = done_batch(one, batch.id)
            assert done.output_file_id is not None
            lines = other.files.content(done.output_file_id).text.splitlines()
            assert [json.loads(x)["custom_id"] for x in lines] == ["req-0", "req-1"]
            with pytest.raises(openai.NotFoundError):
                stranger.files.content(done.output_file_id)
            with pytest.raises(openai.NotFoundError):
                stranger.batches.retrieve(batch.id)
        conversations = [other.conversations.create() for _ in range(2)]
        for conv in conversations:
            for turn in range(2):
                client = (one, other)[turn]
                client.responses.create(model="gpt-test", input=f"t{turn}", conversation=conv.id)
            assert len(one.conversations.items.list(conv.id).data) == 2
        # the map is in Redis, bound to the tenant
        with Redis.from_url(redis.url) as peek:
            value = peek.get(f"gateway:response-owner:v1:default:{files[0].id}")
        assert value in (b"a\x1ft1", b"b\x1ft1")
    with (
        anthropic.Anthropic(base_url=replicas[0].url, api_key=KEY_ONE, max_retries=0) as first,
        anthropic.Anthropic(base_url=replicas[1].url, api_key=KEY_ONE, max_retries=0) as second,
    ):
        batches = [first.messages.batches.create(requests=message_requests(2)) for _ in range(2)]  # type: ignore[arg-type]
        for batch in batches:
            ended_batch(second, batch.id)
            assert [r.custom_id for r in second.messages.batches.results(batch.id)] == [
                "req-0",
                "req-1",
            ]


def test_a_dead_redis_keeps_each_replica_s_own_objects_and_hides_the_rest(
    gateway, mock_pair, redis
):
    """With auth on, an id only Redis knew is a 404 while Redis is down (it could be another
    tenant's); the replica that recorded an object still reaches it."""
    a, b = mock_pair
    toml = TWO_TENANTS.replace('mode = "keys"', f'mode = "keys"\nredis_url = "{redis.url}"')
    config = gateway_config(toml + mixed_toml(a.url, b.url))
    first, second = gateway(config), gateway(config)
    with (
        openai.OpenAI(base_url=first.base_url, api_key=KEY_ONE, max_retries=0) as one,
        openai.OpenAI(base_url=second.base_url, api_key=KEY_ONE, max_retries=0) as other,
    ):
        made = one.files.create(file=("x.txt", b"kept"), purpose="user_data")
        assert other.files.content(made.id).read() == b"kept"  # through Redis
        redis.kill()
        later = one.files.create(file=("y.txt", b"local"), purpose="user_data")
        assert one.files.content(later.id).read() == b"local"  # recorded here
        assert one.files.content(made.id).read() == b"kept"
        with pytest.raises(openai.NotFoundError):
            other.files.content(later.id)  # only Redis could have told it
