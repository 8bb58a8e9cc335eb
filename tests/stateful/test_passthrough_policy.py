"""Paths the gateway does not model, with auth on (docs/spec.md §26): forwarded only where the
key's ``passthrough`` globs (narrowed by its tenant's) grant them — admin keys get every path —
never with another tenant's id in the path, the query or a JSON body, and never answered with
a listing of stored objects the gateway could not filter. The first route's backend is a
scripted upstream that records what reaches it; files live on two mock backends."""

from __future__ import annotations

import asyncio

import httpx2
import openai
import orjson
import pytest

from tests.stateful.support import KEY_ONE, MockBackend
from tests.support import (
    GatewayServer,
    ScriptedUpstream,
    SeenRequest,
    digest,
    gateway_config,
    http_response,
)

KEY_PLAIN, KEY_GRANTED, KEY_ADMIN, KEY_NARROW = "sk-plain", "sk-granted", "sk-admin", "sk-narrow"
LISTED = "asst_of_somebody_else_1"


def config(scripted: str, a: str, b: str, auth: bool = True) -> str:
    keys = f"""
[auth]
mode = "keys"

[[auth.keys]]
tenant = "t1"
sha256 = "{digest(KEY_ONE)}"

[[auth.keys]]
tenant = "t2"
sha256 = "{digest(KEY_PLAIN)}"

[[auth.keys]]
tenant = "t2"
sha256 = "{digest(KEY_GRANTED)}"
passthrough = ["/v1/audio/*", "/v1/assistants*", "/v1/fine_tuning/*", "/v1/responses/*"]

[[auth.keys]]
tenant = "ops"
sha256 = "{digest(KEY_ADMIN)}"
admin = true

[[auth.keys]]
tenant = "narrow"
sha256 = "{digest(KEY_NARROW)}"
passthrough = ["*"]

[[auth.tenants]]
name = "narrow"
passthrough = ["/v1/audio/*"]
"""
    return (
        (keys if auth else "")
        + f"""
[[backends]]
name = "scripted"
url = "{scripted}"
api_key_env = "TEST_BACKEND_KEY"

[[backends]]
name = "a"
url = "{a}/v1"

[[backends]]
name = "b"
url = "{b}/v1"

[[routes]]
name = "scripted"
models = ["scripted-*"]
backends = ["scripted"]

[[routes]]
name = "main"
models = ["*"]
backends = ["a", "b"]
purposes = ["*"]
"""
    )


async def _answer(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
    path = req.target.split("?", 1)[0]
    if req.method == "GET" and path in ("/v1/assistants", "/v1/chat/completions"):
        page = {"object": "list", "data": [{"id": LISTED, "object": "assistant"}]}
        writer.write(http_response(200, orjson.dumps(page)))
    elif path == "/v1/audio/speech":
        writer.write(http_response(200, b"ID3-audio", "audio/mpeg"))
    else:
        writer.write(http_response(200, orjson.dumps({"id": "ftjob-abc123", "object": "x"})))
    return True


@pytest.fixture
def scripted(upstream) -> ScriptedUpstream:
    return upstream(_answer)


@pytest.fixture
def server(gateway, scripted, mock_pair) -> GatewayServer:
    a, b = mock_pair
    return gateway(gateway_config(config(scripted.url, a.url, b.url)))


def send(
    gw: GatewayServer, key: str, method: str, path: str, body: object = None
) -> httpx2.Response:
    content = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx2.request(method, gw.url + path, content=content, headers=headers, timeout=30)


def code(r: httpx2.Response) -> str:
    return str(r.json()["error"]["code"])


def seen(scripted: ScriptedUpstream, pair: tuple[MockBackend, MockBackend]) -> str:
    """Everything every backend received, as text."""
    texts = [f"{r.target}\n{r.body.decode('utf-8', 'replace')}" for r in scripted.requests]
    texts += [x.text() for backend in pair for x in backend.seen]
    return "\n".join(texts)


SPEECH = {"model": "scripted-tts", "input": "hello", "voice": "alloy"}


def test_a_path_not_modelled_needs_the_key_s_grant(gateway, server, scripted, mock_pair):
    r = send(server, KEY_PLAIN, "POST", "/v1/audio/speech", SPEECH)
    assert r.status_code == 403 and code(r) == "passthrough_not_allowed"
    assert "passthrough" in r.json()["error"]["message"]
    assert scripted.requests == []
    for key in (KEY_GRANTED, KEY_ADMIN, KEY_NARROW):
        r = send(server, key, "POST", "/v1/audio/speech", SPEECH)
        assert r.status_code == 200 and r.content == b"ID3-audio", key
    assert len(scripted.requests) == 3
    # one model's page is as open as the catalogue; deleting a model is not
    r = send(server, KEY_PLAIN, "GET", "/v1/models/scripted-tts")
    assert r.status_code == 200
    r = send(server, KEY_PLAIN, "DELETE", "/v1/models/scripted-tts")
    assert r.status_code == 403 and code(r) == "passthrough_not_allowed"
    assert len(scripted.requests) == 4
    # the tenant narrows its key's "*"
    r = send(server, KEY_NARROW, "GET", "/v1/fine_tuning/jobs/ftjob-abc123")
    assert r.status_code == 403 and code(r) == "passthrough_not_allowed"
    # with auth off every path passes, as documented (docs/spec.md §5)
    a, b = mock_pair
    open_gw = gateway(gateway_config(config(scripted.url, a.url, b.url, auth=False)))
    assert send(open_gw, "sk-any", "POST", "/v1/audio/speech", SPEECH).status_code == 200


def test_a_listing_of_stored_objects_is_never_relayed(server, scripted, mock_pair):
    for key, path in ((KEY_GRANTED, "/v1/assistants"), (KEY_ADMIN, "/v1/chat/completions")):
        r = send(server, key, "GET", path)
        assert r.status_code == 403 and code(r) == "unfiltered_listing", r.text
        assert LISTED not in r.text
    r = send(server, KEY_GRANTED, "GET", "/v1/fine_tuning/jobs/ftjob-abc123")  # one object
    assert r.status_code == 200 and r.json()["id"] == "ftjob-abc123"


def test_another_tenant_s_ids_never_reach_an_unmodelled_path(server, scripted, mock_pair):
    with (
        openai.OpenAI(base_url=server.base_url, api_key=KEY_ONE, max_retries=0) as one,
        openai.OpenAI(base_url=server.base_url, api_key=KEY_GRANTED, max_retries=0) as two,
    ):
        theirs = one.files.create(file=("t.jsonl", b"{}\n"), purpose="fine-tune").id
        mine = two.files.create(file=("m.jsonl", b"{}\n"), purpose="fine-tune").id
        made = one.responses.create(model="gpt-test", input="hi").id
    job = {"model": "scripted-ft", "training_file": theirs}
    refused = [
        ("POST", "/v1/fine_tuning/jobs", job),  # the table's place
        ("POST", "/v1/fine_tuning/jobs", {**job, "training_file": "file-never-made-here1"}),
        ("GET", f"/v1/fine_tuning/jobs/{theirs}/events", None),  # a path segment
        ("GET", f"/v1/fine_tuning/jobs?after={theirs}", None),  # a query value
        ("POST", "/v1/audio/speech", {**SPEECH, "extra": {"deep": [theirs]}}),  # anywhere
        ("POST", "/v1/responses/input_tokens", {"model": "gpt-test", "previous_response_id": made}),
        (
            "POST",
            "/v1/assistants",
            {"tool_resources": {"code_interpreter": {"file_ids": [theirs]}}},
        ),
    ]
    for method, path, body in refused:
        r = send(server, KEY_GRANTED, method, path, body)
        assert r.status_code == 404, (path, r.text)
    # a JSON body behind a byte-order mark, a form: read as a lenient upstream would
    bom = b"\xef\xbb\xbf" + orjson.dumps(job)
    assert send(server, KEY_GRANTED, "POST", "/v1/fine_tuning/jobs", bom).status_code == 404
    form = httpx2.post(
        server.url + "/v1/fine_tuning/jobs",
        content=f"model=scripted-ft&training_file={theirs}".encode(),
        headers={
            "authorization": f"Bearer {KEY_GRANTED}",
            "content-type": "application/x-www-form-urlencoded",
        },
    )
    assert form.status_code == 404, form.text
    # the reader that keeps the first of two keys would see theirs: the gateway sends one
    twice = b'{"model":"scripted-ft","training_file":"%s","training_file":"%s"}' % (
        theirs.encode(),
        mine.encode(),
    )
    assert send(server, KEY_GRANTED, "POST", "/v1/fine_tuning/jobs", twice).status_code == 200
    assert orjson.loads(scripted.requests[-1].body)["training_file"] == mine
    everything = seen(scripted, mock_pair)
    assert theirs not in everything and made not in everything
