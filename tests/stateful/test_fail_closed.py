"""Fail closed with auth on (docs/spec.md §26): an object another tenant made — or one the
gateway cannot place — is a 404 wherever a request names it: in the path (in any spelling),
in a model call's body (nested content parts, string or object forms, arrays), in a stateful
call's body; and lists show each tenant its own, whatever their size or spelling.

Two real mock backends share one upstream "key" for every tenant, as OpenAI does, and record
every request they receive: "never forwarded" means no backend saw the id at all, in any
form (path or query, raw or decoded, body bytes or decoded JSON strings)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import orjson
import pytest

from tests.stateful.support import (
    KEY_ONE,
    KEY_TWO,
    TWO_TENANTS,
    MockBackend,
    batch_jsonl,
    mixed_toml,
)
from tests.support import GatewayServer, gateway_config

UNKNOWN_FILE = "file-0123456789abcdef01234567"


@pytest.fixture
def server(gateway, mock_pair) -> GatewayServer:
    a, b = mock_pair
    return gateway(gateway_config(TWO_TENANTS + mixed_toml(a.url, b.url)))


@dataclass
class Objects:
    """What one tenant made through the gateway."""

    file: str
    vector_store: str
    conversation: str
    response: str
    batch: str

    def ids(self) -> list[str]:
        return [self.file, self.vector_store, self.conversation, self.response, self.batch]


def make_objects(client: openai.OpenAI) -> Objects:
    file = client.files.create(file=("in.jsonl", batch_jsonl(1)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # a vector store's files must be on its backend: made from the file, it is
    store = client.vector_stores.create(name="s", file_ids=[file.id])
    conversation = client.conversations.create()
    response = client.responses.create(model="gpt-test", input="hi")
    return Objects(file.id, store.id, conversation.id, response.id, batch.id)


@pytest.fixture
def tenants(server) -> Iterator[tuple[Objects, Objects]]:
    """Objects of tenant t1 (KEY_ONE) and of tenant t2 (KEY_TWO)."""
    with (
        openai.OpenAI(base_url=server.base_url, api_key=KEY_ONE, max_retries=0) as one,
        openai.OpenAI(base_url=server.base_url, api_key=KEY_TWO, max_retries=0) as two,
    ):
        yield make_objects(one), make_objects(two)


def call(server: GatewayServer, key: str, method: str, path: str, body: Any = None) -> Any:
    content = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx2.request(method, server.url + path, content=content, headers=headers, timeout=30)


def reached(pair: tuple[MockBackend, MockBackend], since: tuple[int, int], secret: str) -> bool:
    """Whether any backend received ``secret`` after ``since`` (each backend's count)."""
    return any(
        secret in arrived.text() for b, n in zip(pair, since, strict=True) for arrived in b.seen[n:]
    )


def mark(pair: tuple[MockBackend, MockBackend]) -> tuple[int, int]:
    return len(pair[0].seen), len(pair[1].seen)


def gateway_404(r: Any) -> bool:
    return r.status_code == 404 and r.json()["error"]["code"] in ("not_found", "unknown_path")


# ---------------------------------------------------------------- model calls


def _responses(**fields: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "input": "hi", **fields}


def _content(part: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-test", "input": [{"role": "user", "content": [part]}]}


def _claude(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "claude-test",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, *blocks]}],
    }


def _document(file_id: str) -> dict[str, Any]:
    return {"type": "document", "source": {"type": "file", "file_id": file_id}}


#: (path, the body naming the objects of ``o``, the object named)
REFERENCES: dict[str, tuple[str, Callable[[Objects], dict[str, Any]], str]] = {
    "chat-file-part": (
        "/v1/chat/completions",
        lambda o: {
            "model": "gpt-test",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "read it"},
                        {"type": "file", "file": {"file_id": o.file}},
                    ],
                }
            ],
        },
        "file",
    ),
    "responses-input-file": (
        "/v1/responses",
        lambda o: _content({"type": "input_file", "file_id": o.file}),
        "file",
    ),
    "responses-input-image": (
        "/v1/responses",
        lambda o: _content({"type": "input_image", "file_id": o.file, "detail": "auto"}),
        "file",
    ),
    "responses-function-output": (
        "/v1/responses",
        lambda o: {
            "model": "gpt-test",
            "input": [
                {
                    "type": "function_call_output",
                    "call_id": "call_1",
                    "output": [{"type": "input_file", "file_id": o.file}],
                }
            ],
        },
        "file",
    ),
    "responses-file-search": (
        "/v1/responses",
        lambda o: _responses(tools=[{"type": "file_search", "vector_store_ids": [o.vector_store]}]),
        "vector_store",
    ),
    "responses-code-interpreter-files": (
        "/v1/responses",
        lambda o: _responses(
            tools=[
                {"type": "code_interpreter", "container": {"type": "auto", "file_ids": [o.file]}}
            ]
        ),
        "file",
    ),
    "responses-previous": (
        "/v1/responses",
        lambda o: _responses(previous_response_id=o.response),
        "response",
    ),
    "responses-conversation-string": (
        "/v1/responses",
        lambda o: _responses(conversation=o.conversation),
        "conversation",
    ),
    "responses-conversation-object": (
        "/v1/responses",
        lambda o: _responses(conversation={"id": o.conversation}),
        "conversation",
    ),
    "responses-prompt-variable": (
        "/v1/responses",
        lambda o: _responses(
            prompt={"id": "pmpt_1", "variables": {"doc": {"type": "input_file", "file_id": o.file}}}
        ),
        "file",
    ),
    "messages-document": ("/v1/messages", lambda o: _claude(_document(o.file)), "file"),
    "messages-image": (
        "/v1/messages",
        lambda o: _claude({"type": "image", "source": {"type": "file", "file_id": o.file}}),
        "file",
    ),
    "messages-container-upload": (
        "/v1/messages",
        lambda o: _claude({"type": "container_upload", "file_id": o.file}),
        "file",
    ),
    "messages-tool-result-nested": (
        "/v1/messages",
        lambda o: _claude(
            {"type": "tool_result", "tool_use_id": "t1", "content": [_document(o.file)]}
        ),
        "file",
    ),
    "count-tokens-document": (
        "/v1/messages/count_tokens",
        lambda o: _claude(_document(o.file)),
        "file",
    ),
}


@pytest.mark.parametrize("case", REFERENCES.values(), ids=REFERENCES.keys())
def test_a_model_call_naming_another_tenant_s_object_is_404_and_never_sent(
    server, mock_pair, tenants, case
):
    path, body, kind = case
    mine, theirs = tenants
    named = getattr(theirs, kind)
    before = mark(mock_pair)
    r = call(server, KEY_ONE, "POST", path, body(theirs))
    assert gateway_404(r), r.text
    assert not reached(mock_pair, before, named)
    # an id the gateway never saw made: 404 too (it could be anybody's)
    unknown = Objects(UNKNOWN_FILE, "vs_unknown0001", "conv_unknown0001", "resp_unknown01", "x")
    assert gateway_404(call(server, KEY_ONE, "POST", path, body(unknown)))
    assert not reached(mock_pair, before, "unknown0")
    # the owner's own call goes upstream
    r = call(server, KEY_ONE, "POST", path, body(mine))
    assert not gateway_404(r), r.text
    assert reached(mock_pair, before, getattr(mine, kind))


def test_arrays_nesting_and_odd_places_are_checked_too(server, mock_pair, tenants):
    mine, theirs = tenants
    before = mark(mock_pair)
    stores = _responses(
        tools=[
            {"type": "file_search", "vector_store_ids": [mine.vector_store, theirs.vector_store]}
        ]
    )
    deeper = {  # a file_id at a place the table does not list: another tenant's is refused
        "model": "gpt-test",
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "file",
                        "file": {"file_id": mine.file, "more": {"file_id": theirs.file}},
                    }
                ],
            }
        ],
    }
    for path, body in (("/v1/responses", stores), ("/v1/chat/completions", deeper)):
        assert gateway_404(call(server, KEY_ONE, "POST", path, body))
    assert not reached(mock_pair, before, theirs.vector_store)
    assert not reached(mock_pair, before, theirs.file)


def test_a_body_that_could_be_read_two_ways_is_checked_as_the_upstream_reads_it(
    server, mock_pair, tenants
):
    """Duplicate keys (a reader keeping the first) and keys spelled with \\u escapes."""
    mine, theirs = tenants
    before = mark(mock_pair)
    last_wins = (
        b'{"model":"gpt-test","input":"hi","previous_response_id":"%s",'
        b'"previous_response_id":"%s"}' % (theirs.response.encode(), mine.response.encode())
    )
    r = call(server, KEY_ONE, "POST", "/v1/responses", last_wins)
    assert r.status_code == 200, r.text  # the gateway's reading, re-serialised: theirs is gone
    first_wins = last_wins.replace(theirs.response.encode(), b"@").replace(
        mine.response.encode(), theirs.response.encode()
    )
    first_wins = first_wins.replace(b"@", mine.response.encode())
    assert gateway_404(call(server, KEY_ONE, "POST", "/v1/responses", first_wins))
    escaped = [
        b'{"model":"gpt-test","input":"hi","previous\\u005fresponse_id":"%s"}'
        % theirs.response.encode(),
        b'{"model":"gpt-test","messages":[{"role":"user","content":[{"type":"file","file":'
        b'{"fil\\u0065_id":"%s"}}]}]}' % theirs.file.encode(),
    ]
    for body in escaped:
        path = "/v1/responses" if b'"input"' in body else "/v1/chat/completions"
        assert gateway_404(call(server, KEY_ONE, "POST", path, body))
    assert not reached(mock_pair, before, theirs.response)
    assert not reached(mock_pair, before, theirs.file)


# ---------------------------------------------------------------- stateful bodies and paths


def _upload_part(client: openai.OpenAI) -> tuple[str, str]:
    upload = client.uploads.create(
        bytes=4, filename="u.txt", mime_type="text/plain", purpose="user_data"
    )
    return upload.id, client.uploads.parts.create(upload.id, data=b"part").id


def test_stateful_bodies_naming_another_tenant_s_objects_are_404(server, mock_pair, tenants):
    mine, theirs = tenants
    with (
        openai.OpenAI(base_url=server.base_url, api_key=KEY_ONE, max_retries=0) as one,
        openai.OpenAI(base_url=server.base_url, api_key=KEY_TWO, max_retries=0) as two,
    ):
        upload, own_part = _upload_part(one)
        _, their_part = _upload_part(two)
    before = mark(mock_pair)
    r = call(server, KEY_ONE, "POST", f"/v1/uploads/{upload}/complete", {"part_ids": [their_part]})
    assert gateway_404(r), r.text
    assert not reached(mock_pair, before, their_part)
    store = f"/v1/vector_stores/{mine.vector_store}"
    item = {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": ""}]}
    item["content"][0]["file_id"] = theirs.file
    calls = [
        ("POST", f"{store}/file_batches", {"file_ids": [theirs.file]}),
        ("POST", f"{store}/file_batches", {"files": [{"file_id": theirs.file}]}),
        ("POST", f"{store}/files", {"file_id": theirs.file}),
        ("POST", "/v1/conversations", {"items": [item]}),
        ("POST", f"/v1/conversations/{mine.conversation}/items", {"items": [item]}),
        ("POST", "/v1/batches", {"input_file_id": theirs.file, "endpoint": "/v1/responses"}),
        ("GET", f"{store}/files/{theirs.file}", None),  # an id after the object's
        ("GET", f"/v1/files?after={theirs.file}", None),
    ]
    for method, path, body in calls:
        r = call(server, KEY_ONE, method, path, body)
        assert gateway_404(r), (path, r.text)
    assert not reached(mock_pair, before, theirs.file)
    # the owner's own parts make a file
    r = call(server, KEY_ONE, "POST", f"/v1/uploads/{upload}/complete", {"part_ids": [own_part]})
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text


@pytest.mark.parametrize(
    "spelling",
    [
        "/v1/files/{file}",
        "/v1/files/{file}/",
        "/v1/files/{file}/content",
        "/v1/files/{file}/content/",
        "/v1/files/%66{file_rest}",  # the id percent-encoded: the gateway cannot place it
        "/v1/Files/{file}",
        "/v1/FILES/{file}/content",
        "/v1/batches/{batch}/cancel/",
        "/v1/vector_stores/{vector_store}/",
        "/v1/conversations/{conversation}/items/",
        "/v1/responses/{response}",
        "/v1/responses/{response}/",
        "/v1/responses/{response}/input_items",
        "/v1/responses/%72{response_rest}",
    ],
)
@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_another_tenant_s_object_is_404_in_every_spelling(
    server, mock_pair, tenants, spelling, method
):
    _, theirs = tenants
    path = spelling.format(
        file=theirs.file,
        file_rest=theirs.file[1:],
        batch=theirs.batch,
        vector_store=theirs.vector_store,
        conversation=theirs.conversation,
        response=theirs.response,
        response_rest=theirs.response[1:],
    )
    before = mark(mock_pair)
    r = call(server, KEY_ONE, method, path)
    assert gateway_404(r), (path, r.status_code, r.text)
    for secret in theirs.ids():
        assert not reached(mock_pair, before, secret)
        assert not reached(mock_pair, before, secret[1:])


def test_the_owner_gets_one_spelling_and_unmodelled_paths_are_never_forwarded(
    server, mock_pair, tenants
):
    mine, _ = tenants
    r = call(server, KEY_ONE, "GET", f"/v1/files/{mine.file}/content/")
    assert r.status_code == 200 and r.content == batch_jsonl(1)
    assert mock_pair[0].seen[-1].path.endswith(f"/files/{mine.file}/content")
    before = mark(mock_pair)
    for path in (
        f"/v1/files/{mine.file}/whatever",
        f"/v1/messages/batches/{mine.batch}/resultz",
        f"/v1/responses/{mine.response}/elsewhere",
        "/v1/chat/completions/chatcmpl-123456",  # stored chat completions: never placed
    ):
        assert gateway_404(call(server, KEY_ONE, "GET", path)), path
    assert mark(mock_pair) == before


# ---------------------------------------------------------------- lists


@pytest.mark.parametrize("slash", ["", "/"])
def test_lists_show_the_tenant_its_own_in_every_spelling(server, mock_pair, tenants, slash):
    mine, theirs = tenants
    for collection, own in (
        ("files", mine.file),
        ("batches", mine.batch),
        ("vector_stores", mine.vector_store),
    ):
        r = call(server, KEY_ONE, "GET", f"/v1/{collection}{slash}")
        assert r.status_code == 200, r.text
        ids = [o["id"] for o in r.json()["data"]]
        assert own in ids
        assert not set(theirs.ids()) & set(ids)
        assert not any(x in r.text for x in theirs.ids())


def test_a_page_too_long_to_filter_is_refused_never_relayed(
    server, mock_pair, tenants, monkeypatch
):
    _, theirs = tenants
    monkeypatch.setattr("gateway.hops.held.HOLD_LIMIT", 64)
    for path in ("/v1/files", "/v1/files/", "/v1/batches?limit=100"):
        r = call(server, KEY_ONE, "GET", path)
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "list_unfiltered"
        assert not any(x in r.text for x in theirs.ids())
