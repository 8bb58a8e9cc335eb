"""Which route a call naming no model and no known object goes to (docs/spec.md §24): the
``x-gateway-route`` header, else a route whose ``purposes`` match, else the only route that can
serve it — and a clear 400 in the OpenAI shape when nothing decides, never a silent first
route."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.stateful.support import MockBackend
from tests.support import GatewayServer, gateway_config


def two_routes(a: MockBackend, b: MockBackend, purposes: str = "") -> str:
    return f"""
[[backends]]
name = "a"
url = "{a.url}/v1"

[[backends]]
name = "b"
url = "{b.url}/v1"

[[routes]]
name = "first"
models = ["gpt-*"]
backends = ["a"]
{purposes}

[[routes]]
name = "second"
models = ["o*"]
backends = ["b"]
purposes = ["batch", "vector_*"]
"""


@pytest.fixture
def server(gateway, mock_pair) -> GatewayServer:
    return gateway(gateway_config(two_routes(*mock_pair)))


@pytest.fixture
def client(server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="sk-any", max_retries=0) as c:
        yield c


def test_nothing_decides_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(file=("x.txt", b"x"), purpose="user_data")
    body = exc.value.body
    assert isinstance(body, dict) and body["code"] == "route_required"
    assert "x-gateway-route" in body["message"] and "'user_data'" in body["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.conversations.create()
    with pytest.raises(openai.BadRequestError):
        client.files.list()


def test_the_header_names_the_route(client, mock_pair):
    a, b = mock_pair
    for route, backend in (("first", a), ("second", b)):
        made = client.files.create(
            file=("x.txt", b"x"), purpose="user_data", extra_headers={"x-gateway-route": route}
        )
        assert made.id in backend.objects.files.files
        # later calls naming it need no header: they follow the object
        assert client.files.content(made.id).read() == b"x"
    conv = client.conversations.create(extra_headers={"x-gateway-route": "second"})
    assert conv.id in b.objects.conversations.meta
    listed = client.files.list(extra_headers={"x-gateway-route": "first"})
    assert [f.id for f in listed.data] == list(a.objects.files.files)
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(
            file=("x.txt", b"x"), purpose="batch", extra_headers={"x-gateway-route": "nope"}
        )
    assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "unknown_route"


def test_purposes_pick_the_route(client, mock_pair):
    _, b = mock_pair
    made = client.files.create(file=("in.jsonl", b"{}\n"), purpose="batch")  # read from the form
    assert made.id in b.objects.files.files
    store = client.vector_stores.create(name="s")  # purpose vector_stores
    assert store.id in b.objects.vector_stores.stores
    upload = client.uploads.create(bytes=1, filename="x", mime_type="text/plain", purpose="batch")
    assert upload.id in b.objects.files.uploads
    assert [f.id for f in client.files.list(purpose="batch").data] == [made.id]


def test_a_single_route_decides_alone(gateway, mock_pair):
    a, _ = mock_pair
    config = gateway_config(
        f'[[backends]]\nname = "a"\nurl = "{a.url}/v1"\n\n'
        '[[routes]]\nmodels = ["*"]\nbackends = ["a"]\n'
    )
    server = gateway(config)
    with openai.OpenAI(base_url=server.base_url, api_key="sk-any", max_retries=0) as c:
        made = c.files.create(file=("x.txt", b"x"), purpose="user_data")
        assert made.id in a.objects.files.files
