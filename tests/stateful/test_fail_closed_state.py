"""With auth on, §24's rule wins over §22's (docs/spec.md §26): an id the gateway cannot place
is a 404 and never reaches a backend — after ``response_affinity_ttl_s`` / ``object_ttl_s``,
and on a replica whose Redis is down (a real ``redis-server``, stopped). The replica that
recorded an object still reaches it; with auth off an unknown response id still goes by model
(§22)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest

from tests.redis_support import RedisServer
from tests.stateful.support import KEY_ONE, KEY_TWO, TWO_TENANTS, mixed_toml, pair_toml
from tests.stateful.test_fail_closed import call, gateway_404, mark, reached
from tests.support import gateway_config


def _chat_with_file(file_id: str) -> dict[str, object]:
    part = {"type": "file", "file": {"file_id": file_id}}
    return {"model": "gpt-test", "messages": [{"role": "user", "content": [part]}]}


def test_after_the_affinity_ttl_an_id_is_404_for_its_own_tenant_too(gateway, mock_pair):
    a, b = mock_pair
    short = "response_affinity_ttl_s = 0.5\nobject_ttl_s = 0.5\npurposes = ['*']"
    gw = gateway(gateway_config(TWO_TENANTS + pair_toml(a.url, b.url, route_extra=short)))
    with openai.OpenAI(base_url=gw.base_url, api_key=KEY_ONE, max_retries=0) as one:
        made = one.responses.create(model="gpt-test", input="hi")
        file = one.files.create(file=("x.txt", b"x"), purpose="user_data")
        assert one.files.retrieve(file.id).id == file.id  # known while it lives
        time.sleep(0.8)
        before = mark(mock_pair)
        for key in (KEY_ONE, KEY_TWO):
            for method, path, body in (
                (
                    "POST",
                    "/v1/responses",
                    {"model": "gpt-test", "input": "more", "previous_response_id": made.id},
                ),
                ("GET", f"/v1/responses/{made.id}", None),
                ("GET", f"/v1/files/{file.id}", None),
                ("POST", "/v1/chat/completions", _chat_with_file(file.id)),
            ):
                r = call(gw, key, method, path, body)
                assert gateway_404(r), (key, path, r.text)
        assert not reached(mock_pair, before, made.id)
        assert not reached(mock_pair, before, file.id)


def test_with_auth_off_an_unknown_response_id_still_goes_by_model(gateway, mock_pair):
    a, b = mock_pair
    gw = gateway(gateway_config(pair_toml(a.url, b.url)))
    before = mark(mock_pair)
    r = call(
        gw,
        "sk-any",
        "POST",
        "/v1/responses",
        {"model": "gpt-test", "input": "x", "previous_response_id": "resp_made_elsewhere1"},
    )
    assert not gateway_404(r)
    assert reached(mock_pair, before, "resp_made_elsewhere1")


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_a_replica_whose_redis_is_down_refuses_the_ids_only_redis_knew(gateway, mock_pair, redis):
    a, b = mock_pair
    auth = TWO_TENANTS.replace('mode = "keys"', f'mode = "keys"\nredis_url = "{redis.url}"')
    config = gateway_config(auth + mixed_toml(a.url, b.url))
    first, second = gateway(config), gateway(config)
    with openai.OpenAI(base_url=first.base_url, api_key=KEY_ONE, max_retries=0) as one:
        made = one.responses.create(model="gpt-test", input="hi")
        file = one.files.create(file=("x.txt", b"x"), purpose="user_data")
    follow = {"model": "gpt-test", "input": "more", "previous_response_id": made.id}
    # through Redis, the second replica places both
    assert call(second, KEY_ONE, "POST", "/v1/responses", follow).status_code == 200
    assert call(second, KEY_ONE, "GET", f"/v1/files/{file.id}").status_code == 200
    redis.stop()
    before = mark(mock_pair)
    for key in (KEY_ONE, KEY_TWO):
        for method, path, body in (
            ("POST", "/v1/responses", follow),
            ("POST", "/v1/responses", {"model": "gpt-test", "input": "x", "conversation": made.id}),
            ("GET", f"/v1/responses/{made.id}", None),
            ("GET", f"/v1/responses/{made.id}/input_items", None),
            ("DELETE", f"/v1/responses/{made.id}", None),
            ("GET", f"/v1/files/{file.id}/content", None),
            ("POST", "/v1/chat/completions", _chat_with_file(file.id)),
        ):
            r = call(second, key, method, path, body)
            assert gateway_404(r), (key, path, r.text)
    assert not reached(mock_pair, before, made.id)
    assert not reached(mock_pair, before, file.id)
    # the replica that recorded them still does, for their tenant only
    assert call(first, KEY_ONE, "POST", "/v1/responses", follow).status_code == 200
    assert call(first, KEY_ONE, "GET", f"/v1/files/{file.id}").status_code == 200
    assert gateway_404(call(first, KEY_TWO, "POST", "/v1/responses", follow))
