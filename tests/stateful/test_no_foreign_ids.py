"""The property of docs/spec.md §26, fed generated requests: no object id tenant A owns is ever
sent upstream on tenant B's request, nor shown in B's answer.

Tenant A makes a file, a vector store, a conversation, a response and a batch through a real
gateway; two mock backends that share one upstream key (as OpenAI does) record every request
they receive. Hypothesis then sends, as tenant B, requests that name A's ids (and B's own, and
ids nobody made) where requests name stored objects: in paths (every collection and action, a
trailing slash, a percent-encoded or case-changed spelling, a cursor in the query), and in
bodies at the reference table's places and deeper under a reference key (string, array and
``{"id"}`` forms, nested lists and objects), spelled plainly, with a key given twice or with
``\\u`` escapes. B's key may also reach a few unmodelled paths (``passthrough``). After each,
the test reads every request the backends received for any of A's ids, raw and decoded.

An answer may quote an id B sent (a 404 names it); it never shows B any other id of A's.
The property is about the places a request names objects by — the endpoint's own reference
keys, at any depth; a prompt that quotes an id as text is text, and a key another API reads
(``vector_store_ids`` in a chat completion) names nothing there: neither is part of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote

import httpx2
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.stateful.support import KEY_ONE, KEY_TWO, TWO_TENANTS, MockBackend, mixed_toml
from tests.stateful.test_fail_closed import Objects, make_objects
from tests.support import GatewayServer, gateway_config

#: tenant "t2"'s key may pass through the paths the gateway does not place (docs/spec.md §26)
AUTH = TWO_TENANTS + 'passthrough = ["/v1/threads*", "/v1/fine_tuning/*", "/v1/audio/*"]\n'


@pytest.fixture
def world(gateway, mock_pair) -> Iterator[tuple[GatewayServer, Objects, Objects]]:
    a, b = mock_pair
    gw = gateway(gateway_config(AUTH + mixed_toml(a.url, b.url)))
    with (
        openai.OpenAI(base_url=gw.base_url, api_key=KEY_ONE, max_retries=0) as one,
        openai.OpenAI(base_url=gw.base_url, api_key=KEY_TWO, max_retries=0) as two,
    ):
        yield gw, make_objects(one), make_objects(two)


COLLECTIONS = [
    "files",
    "batches",
    "vector_stores",
    "conversations",
    "uploads",
    "messages/batches",
    "responses",
    "chat/completions",
    "threads",
    "fine_tuning/jobs",
]
ACTIONS = ["", "/content", "/cancel", "/items", "/input_items", "/results", "/files", "/search"]


def spelled(object_id: str, how: str) -> str:
    if how == "percent-first":
        return "%" + format(ord(object_id[0]), "02x") + object_id[1:]
    if how == "percent-all":
        return "".join("%" + format(ord(c), "02X") for c in object_id)
    return quote(object_id, safe="")


@st.composite
def paths(draw: st.DrawFn, ids: list[str]) -> tuple[str, str]:
    collection = draw(st.sampled_from(COLLECTIONS))
    if draw(st.booleans()):
        collection = collection.upper() if draw(st.booleans()) else collection.capitalize()
    object_id = spelled(
        draw(st.sampled_from(ids)), draw(st.sampled_from(["", "percent-first", "percent-all"]))
    )
    action = draw(st.sampled_from(ACTIONS))
    if action in ("/files", "/items") and draw(st.booleans()):
        action += "/" + draw(st.sampled_from(ids))
    slash = draw(st.sampled_from(["", "/"]))
    query = draw(st.sampled_from(["", "?limit=2", f"?after={draw(st.sampled_from(ids))}"]))
    if draw(st.booleans()):  # the collection itself, a cursor naming the object
        return draw(st.sampled_from(["GET", "POST"])), f"/v1/{collection}{slash}{query}"
    method = draw(st.sampled_from(["GET", "POST", "DELETE"]))
    return method, f"/v1/{collection}/{object_id}{action}{slash}{query}"


def nested(draw: st.DrawFn, key: str, value: Any) -> Any:
    """``{key: value}`` wrapped in a few lists and objects under reference keys."""
    node: Any = {key: value}
    for _ in range(draw(st.integers(0, 3))):
        wrap = draw(st.sampled_from(["list", "content", "file", "file_id", "source"]))
        node = [node] if wrap == "list" else {wrap: node}
    return node


@st.composite
def bodies(draw: st.DrawFn, ids: list[str], own: Objects) -> tuple[str, dict[str, Any]]:
    """(path, body) of a call naming ``ids`` where calls name stored objects."""
    x = draw(st.sampled_from(ids))
    form = draw(st.sampled_from(["string", "list", "object"]))
    value: Any = {"string": x, "list": [own.file, x], "object": {"id": x}}[form]
    deep = nested(draw, "file_id", value)  # deeper than the table, under the endpoint's key
    keys = st.sampled_from(["file_id", "file_ids", "vector_store_ids"])
    deep_responses = nested(draw, draw(keys), value)
    user = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    choices: list[tuple[str, dict[str, Any]]] = [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": x}}]}]},
        ),
        (
            "/v1/chat/completions",
            {"messages": [{**user, "content": [{"type": "file", "file": deep}]}]},
        ),
        ("/v1/responses", {"previous_response_id": x}),
        ("/v1/responses", {"conversation": value if form != "list" else x}),
        (
            "/v1/responses",
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": x}]}]},
        ),
        ("/v1/responses", {"input": [{"type": "item_reference", "id": x}]}),
        ("/v1/responses", {"input": [{"role": "user", "content": [deep_responses]}]}),
        ("/v1/responses", {"tools": [{"type": "file_search", "vector_store_ids": [x]}]}),
        (
            "/v1/responses",
            {
                "tools": [
                    {"type": "code_interpreter", "container": {"type": "auto", "file_ids": [x]}}
                ]
            },
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "file", "file_id": x}}],
                    }
                ],
            },
        ),
        ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": [deep]}]}),
        ("/v1/batches", {"input_file_id": x, "endpoint": "/v1/chat/completions"}),
        (f"/v1/vector_stores/{own.vector_store}/file_batches", {"files": [{"file_id": x}]}),
        (f"/v1/vector_stores/{own.vector_store}/files", {"file_id": x}),
        (
            "/v1/conversations",
            {"items": [{"type": "message", "role": "user", "content": [deep]}]},
        ),
        ("/v1/fine_tuning/jobs", {"training_file": x}),
        (
            "/v1/threads",
            {"messages": [{"role": "user", "content": "x", "attachments": [{"file_id": x}]}]},
        ),
        ("/v1/audio/speech", {"input": "hi", "voice": nested(draw, "file_id", x)}),
    ]
    path, body = draw(st.sampled_from(choices))
    model = "claude-test" if path.startswith("/v1/messages") else "gpt-test"
    return path, {"model": model, **body}


def spell_body(body: dict[str, Any], how: str, own: str) -> bytes:
    raw = orjson.dumps(body)
    if how == "escaped":  # every reference key's underscore as \u005f
        for key in (b"file_id", b"previous_response_id", b"vector_store_ids", b"input_file_id"):
            raw = raw.replace(b'"' + key + b'"', b'"' + key.replace(b"_", b"\\u005f") + b'"')
    elif how == "twice":  # a reader keeping the first key would see the generated one
        raw = raw[:-1] + b',"previous_response_id":"%s","file_id":"%s"}' % (
            own.encode(),
            own.encode(),
        )
    return raw


def everything_seen(pair: tuple[MockBackend, MockBackend], since: tuple[int, int]) -> str:
    return "\n".join(x.text() for b, n in zip(pair, since, strict=True) for x in b.seen[n:])


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_id_of_tenant_a_reaches_a_backend_on_tenant_b_s_request(world, mock_pair, data):
    gw, theirs, mine = world
    foreign = theirs.ids()
    ids = [*foreign, mine.file, mine.response, "file-nobody0000000000000001"]
    if data.draw(st.booleans(), label="path, else body"):
        method, path = data.draw(paths(ids), label="path")
        content = b""
    else:
        method = "POST"
        path, body = data.draw(bodies(ids, mine), label="body")
        how = data.draw(st.sampled_from(["plain", "escaped", "twice"]), label="spelling")
        content = spell_body(body, how, mine.response)
    since = len(mock_pair[0].seen), len(mock_pair[1].seen)
    r = httpx2.request(
        method,
        gw.url + path,
        content=content or None,
        headers={"authorization": f"Bearer {KEY_TWO}", "content-type": "application/json"},
        timeout=30,
    )
    seen = everything_seen(mock_pair, since)
    sent = unquote(path) + content.decode("utf-8", "replace").replace("\\u005f", "_")
    for secret in foreign:
        assert secret not in seen, (method, path, content, r.status_code)
        if secret not in sent:  # an answer may quote what B sent; never anything else of A's
            assert secret not in r.text, (method, path, content, r.status_code)
