"""Stateful Responses routing (docs/spec.md §22), driven by the official ``openai`` SDK.

Codex and the Agents SDK chain turns with ``previous_response_id`` and read responses back by id;
that state lives only on the backend that created the response. The upstreams here are
:class:`tests.responses_state_support.ResponsesBackend` servers on their own loopback ports,
each holding the responses it made and answering 404 for any other id — so a turn balanced onto
the other backend fails here as it fails a real client. Routes balance over both backends
(``weighted`` 1:1 alternates them; ``least_outstanding`` picks at random between idle ones).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from tests.gateway_process import gateway_process
from tests.responses_state_support import ResponsesBackend, two_backend_config
from tests.support import gateway_config, openai_client


@pytest.fixture
def backends(upstream):
    """Two Responses servers with their own state: (a, b) handlers and their servers."""
    a, b = ResponsesBackend("a"), ResponsesBackend("b")
    return a, b, upstream(a), upstream(b)


def text_of(response: Any) -> str:
    return str(response.output[0].content[0].text)


def create(c: openai.OpenAI, stream: bool = False, **kwargs: Any) -> Any:
    """``responses.create``; a stream is read to its end and its final response returned."""
    kwargs.setdefault("input", "hi")
    if not stream:
        return c.responses.create(model="gpt-test", **kwargs)
    events = list(c.responses.create(model="gpt-test", stream=True, **kwargs))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    return events[-1].response


def follow_ups(a: ResponsesBackend, b: ResponsesBackend) -> list[str]:
    """The backends that received a follow-up, in order."""
    return [
        name
        for name, backend in (("a", a), ("b", b))
        for method, path, previous in backend.seen
        if previous is not None
    ]


# ---------------------------------------------------------------- follow-ups


@pytest.mark.parametrize(
    ("strategy", "stream"),
    [("weighted", False), ("weighted", True), ("least_outstanding", False)],
)
def test_a_conversation_s_turns_all_reach_the_backend_that_holds_it(
    gateway, backends, strategy, stream
):
    a, b, sa, sb = backends
    gw = gateway(gateway_config(two_backend_config(sa.url, sb.url, strategy)))
    c = openai_client(gw.base_url, "sk-client-key", timeout=20)
    first = create(c, stream)
    owner = text_of(first).split()[0]
    assert text_of(first) == f"{owner} turn 1"
    previous = first.id
    # weighted 1:1 would put every second turn on the other backend; least_outstanding picks
    # one of two idle backends at random: 9 follow-ups all landing right by chance is 1 in 512
    for turn in range(2, 11):
        answer = create(c, stream and turn % 2 == 0, previous_response_id=previous)
        assert text_of(answer) == f"{owner} turn {turn}"
        previous = answer.id
    assert follow_ups(a, b) == [owner] * 9
    # conversations that do not follow up are still balanced over both backends (at random
    # for least_outstanding: 20 on one backend is 1 in 500,000)
    fresh = {text_of(create(c)).split()[0] for _ in range(20)}
    assert fresh == {"a", "b"}


def test_retrieve_input_items_cancel_and_delete_reach_the_owner(gateway, backends):
    a, b, sa, sb = backends
    gw = gateway(gateway_config(two_backend_config(sa.url, sb.url, "weighted")))
    c = openai_client(gw.base_url, "sk-client-key", timeout=20)
    on_a = create(c, input="first question")
    on_b = create(c, background=True)  # weighted 1:1: the second call goes to b
    assert on_a.id in a.stored and on_b.id in b.stored and on_b.status == "queued"
    # b is not the first route's backend: without ownership these went to a, which says 404
    assert c.responses.retrieve(on_b.id).id == on_b.id
    assert c.responses.retrieve(on_a.id).id == on_a.id
    items = c.responses.input_items.list(on_a.id)
    assert [i.content[0].text for i in items.data] == ["first question"]
    assert c.responses.input_items.list(on_b.id).data[0].content[0].text == "hi"
    assert c.responses.cancel(on_b.id).status == "cancelled"
    assert c.responses.retrieve(on_b.id).status == "cancelled"
    c.responses.delete(on_b.id)
    assert on_b.id not in b.stored
    with pytest.raises(openai.NotFoundError):  # the owner has no such response any more
        c.responses.retrieve(on_b.id)
    paths = [(m, p) for m, p, _ in b.seen]
    assert ("GET", f"/responses/{on_b.id}") in paths
    assert ("POST", f"/responses/{on_b.id}/cancel") in paths
    assert ("GET", f"/responses/{on_b.id}/input_items") in paths
    assert ("DELETE", f"/responses/{on_b.id}") in paths
    # a DELETE that succeeded forgets the id: the retrieve after it went by the first route
    assert a.seen[-1] == ("GET", f"/responses/{on_b.id}", None)
    assert not any(p.startswith(f"/responses/{on_a.id}") for _, p, _ in b.seen)


def test_unknown_ids_go_by_model_and_the_answer_passes_through(gateway, backends):
    a, _, sa, sb = backends
    gw = gateway(gateway_config(two_backend_config(sa.url, sb.url, "weighted")))
    c = openai_client(gw.base_url, "sk-client-key", timeout=20)
    with pytest.raises(openai.NotFoundError) as caught:
        create(c, previous_response_id="resp_nobody_knows")
    assert caught.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_nobody_knows")
    # the follow-up went where the route's strategy sent it, the retrieve to the first backend
    assert a.seen == [
        ("POST", "/responses", "resp_nobody_knows"),
        ("GET", "/responses/resp_nobody_knows", None),
    ]


def test_store_false_creates_no_mapping(gateway, backends):
    a, _, sa, sb = backends
    gw = gateway(gateway_config(two_backend_config(sa.url, sb.url, "weighted")))
    c = openai_client(gw.base_url, "sk-client-key", timeout=20)
    owners = gw.app.runtime.ownership.local
    unstored = create(c, store=False)
    assert text_of(unstored) == "a turn 1" and not a.stored
    assert len(owners) == 0
    stored = create(c)  # the next one (on b) is stored upstream, and so remembered here
    assert len(owners) == 1 and owners.get_now(stored.id) == "b"


def test_an_ejected_owner_is_still_tried_and_its_error_passes_through(gateway, backends):
    a, b, sa, sb = backends
    config = two_backend_config(
        sa.url, sb.url, "ordered", backend_extra="eject_after = 1\neject_for_s = 600"
    )
    gw = gateway(gateway_config(config))
    c = openai_client(gw.base_url, "sk-client-key", timeout=20)
    first = create(c)
    assert text_of(first) == "a turn 1"
    a.fail_next = 1
    with pytest.raises(openai.InternalServerError):  # a 500 ejects a (eject_after = 1)
        create(c)
    assert text_of(create(c)) == "b turn 1"  # a is out of rotation: new turns go to b
    # a follow-up goes to a anyway: only a knows the conversation
    second = create(c, previous_response_id=first.id)
    assert text_of(second) == "a turn 2"
    assert c.responses.retrieve(first.id).id == first.id
    # and when a fails, its error is the answer: never a re-route to b, which cannot know it
    a.fail_next = 1
    with pytest.raises(openai.InternalServerError):
        create(c, previous_response_id=second.id)
    a.fail_next = 1
    with pytest.raises(openai.InternalServerError):
        c.responses.retrieve(second.id)
    assert follow_ups(a, b) == ["a", "a"]
    assert not any(p.startswith("/responses/resp_") for _, p, _ in b.seen)


# ---------------------------------------------------------------- replicas sharing Redis


def test_two_replicas_sharing_redis_route_every_turn_to_the_owner(tmp_path: Path, backends, redis):
    a, b, sa, sb = backends
    body = two_backend_config(
        sa.url, sb.url, "weighted", extra=f'[auth]\nredis_url = "{redis.url}"\n'
    )
    with (
        gateway_process(tmp_path, body) as one,
        gateway_process(tmp_path, body) as two,
    ):
        replicas = [
            openai_client(one.url + "/v1", "sk-client-key", timeout=20),
            openai_client(two.url + "/v1", "sk-client-key", timeout=20),
        ]
        first = create(replicas[0])
        owner = text_of(first).split()[0]
        previous = first.id
        # each replica balances on its own: without the shared mapping, turns land on both
        for turn in range(2, 9):
            answer = create(replicas[turn % 2], turn % 3 == 0, previous_response_id=previous)
            assert text_of(answer) == f"{owner} turn {turn}"
            previous = answer.id
        assert follow_ups(a, b) == [owner] * 7
        ready = httpx2.get(one.url + "/readyz", timeout=10).json()
        assert ready["responses"] == "redis:ok"  # where the mapping lives, for operators
        # the mapping is in Redis, with the route's TTL (response_affinity_ttl_s, 86400)
        ttl = int(redis.command(f"TTL gateway:response-owner:v1:default:{previous}".encode())[1:])
        assert 86000 < ttl <= 86400
        # reads by id through the other replica
        for c in replicas:
            assert c.responses.retrieve(first.id).id == first.id
        keys = redis.command(b"DBSIZE")
        create(replicas[1], store=False)
        assert redis.command(b"DBSIZE") == keys  # store: false -> no mapping
        replicas[0].responses.delete(previous)
        # the mapping is dropped off the answer's path: wait for it (a loaded machine is slower)
        fewer = b":" + str(int(keys[1:]) - 1).encode()
        deadline = time.monotonic() + 10
        while redis.command(b"DBSIZE") != fewer and time.monotonic() < deadline:
            time.sleep(0.01)
        assert redis.command(b"DBSIZE") == fewer

        # a dead Redis fails no request: the replica that made a response still knows it
        redis.kill()
        answer = create(replicas[0])
        follow = create(replicas[0], previous_response_id=answer.id)
        assert text_of(follow).split()[0] == text_of(answer).split()[0]
        for _ in range(4):  # and the other replica routes by model
            resp = httpx2.post(
                two.url + "/v1/responses",
                json={"model": "gpt-test", "input": "hi", "previous_response_id": answer.id},
                timeout=10,
            )
            assert resp.status_code in (200, 404)
