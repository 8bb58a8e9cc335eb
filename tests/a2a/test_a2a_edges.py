"""A2A through the gateway (docs/spec.md §30): the embedded default's built-in agent answers
the official SDK; spans, metrics and the access log; and what an outsider tries — ids spelled
another way, a card naming another host, a stream cut short."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from a2a.types import CancelTaskRequest, GetTaskRequest, TaskState
from a2a.utils.errors import InternalError

from gateway.config import load_config
from tests.a2a.a2a_support import (
    KEY,
    OTHER_KEY,
    a2a_config,
    keys_section,
    last_state,
    sdk_client,
    send,
    task_of,
    text_of,
)
from tests.model_api_support import traced
from tests.otlp_receiver import OTLPReceiver
from tests.spend_support import sample
from tests.support import LAST_CHUNK, SeenRequest, chunk, http_response, sse_head


def test_the_embedded_default_answers_the_sdk(gateway):
    gw = gateway(load_config(env={}))  # the embedded default: the built-in echo agent
    url = gw.url + "/a2a/echo"

    async def scenario() -> None:
        async with sdk_client(url) as client:
            events = await send(client, "hello from the sdk")
            assert text_of(events) == "hello from the sdk"
            assert len([e for e in events if e.HasField("artifact_update")]) == 4  # word by word
            task_id, _ = task_of(events)
            got = await client.get_task(GetTaskRequest(id=task_id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert text_of(await send(client, "/echo through the tools")) == "through the tools"
            asked = await send(client, "/ask")
            assert last_state(asked) == "TASK_STATE_INPUT_REQUIRED"
            canceled = await client.cancel_task(CancelTaskRequest(id=task_of(asked)[0]))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED

    asyncio.run(scenario())
    listed = httpx.get(gw.url + "/a2a").json()["data"]
    assert listed == [{"name": "echo", "url": url, "card": url + "/.well-known/agent-card.json"}]


def test_spans_metrics_and_the_access_log(gateway, access_lines):
    with OTLPReceiver("http") as receiver:
        extra = traced(receiver.endpoint) + '\n[logging]\naccess_log = "all"\n'
        gw = gateway(load_config(text=_default_with(extra), env={}))
        events = asyncio.run(_stream(gw.url + "/a2a/echo", "traced words"))
        task_id, context_id = task_of(events)
        spans = receiver.wait_for(lambda s: any(x.name == "SendStreamingMessage echo" for x in s))
    (span,) = [s for s in spans if s.name == "SendStreamingMessage echo"]
    a = span.attributes
    assert span.kind == "CLIENT" and a["a2a.method.name"] == "SendStreamingMessage"
    assert a["a2a.task.id"] == task_id and a["a2a.task.state"] == "completed"
    assert a["gen_ai.conversation.id"] == context_id
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "echo"
    (root,) = [s for s in spans if s.span_id == span.parent_span_id]
    assert root.name == "POST /a2a/echo" and root.attributes["a2a.task.id"] == task_id
    assert "gateway.overhead_ms" in root.attributes
    labels = {"agent": "echo", "method": "SendStreamingMessage"}
    assert sample(gw.url, "gateway_a2a_requests_total", **labels, status="ok") == 1
    assert sample(gw.url, "gateway_a2a_request_duration_seconds_count", **labels) == 1
    (line,) = [x for x in access_lines if (x.get("a2a") or {}).get("method") == labels["method"]]
    assert line["a2a"]["task"] == task_id and line["a2a"]["state"] == "completed"
    assert line["backend"] == "echo" and line["attempts"] == 1
    assert "traced words" not in orjson.dumps(access_lines).decode()  # no message in the log


def _default_with(extra: str) -> str:
    from gateway.config import default_config_text

    return default_config_text() + "\n" + extra


async def _stream(url: str, text: str) -> list:
    async with sdk_client(url) as client:
        return await send(client, text)


def test_the_agent_gets_the_calls_span_as_its_parent(gateway, upstream):
    card, calls = _card_agent(upstream, [b'data: {"jsonrpc":"2.0","id":"1","result":{}}\n\n'])
    with OTLPReceiver("http") as receiver:
        gw = gateway(a2a_config(card.url.removesuffix("/v1"), extra=traced(receiver.endpoint)))
        rpc(gw.url, "GetTask", {"id": "t1"})
        spans = receiver.wait_for(lambda s: any(x.name == "GetTask sdk" for x in s))
    (span,) = [s for s in spans if s.name == "GetTask sdk"]
    (post,) = [r for r in calls if r.method == "POST"]
    assert post.header("traceparent") == f"00-{span.trace_id}-{span.span_id}-01"
    assert post.header("authorization") == "Bearer agent-token-from-config"


def rpc(base: str, method: str, params: object, key: str | None = None) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": "1", "method": method, "params": params}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(base + "/a2a/sdk", json=body, headers=headers, timeout=10)


def _card_agent(upstream, answers: list[bytes], card_url: str | None = None):
    """A scripted agent: its card (JSON-RPC at ``card_url``, default its own /rpc), then each
    POST answered by the next SSE answer of ``answers`` (cut: no terminal event)."""
    seen: list[SeenRequest] = []
    state: dict = {}

    async def handler(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        seen.append(req)
        if req.method == "GET":
            url = card_url or f"http://127.0.0.1:{state['port']}/rpc"
            iface = {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            card = {
                "name": "s", "description": "d", "version": "1", "skills": [],
                "capabilities": {"streaming": True}, "defaultInputModes": [],
                "defaultOutputModes": [], "supportedInterfaces": [iface],
            }  # fmt: skip
            writer.write(http_response(200, orjson.dumps(card)))
            return True
        body = answers.pop(0) if answers else b""
        if body.startswith(b"data:"):
            writer.write(sse_head() + chunk(body) + LAST_CHUNK)
        else:
            writer.write(http_response(200, body))
        return True

    server = upstream(handler)
    state["port"] = server.port
    return server, seen


def test_a_stream_cut_short_is_reported_never_passed_off_as_complete(gateway, upstream):
    working = {"statusUpdate": {"taskId": "t1", "contextId": "c1",
                                "status": {"state": "TASK_STATE_WORKING"}}}  # fmt: skip
    event = b"data: " + orjson.dumps({"jsonrpc": "2.0", "id": "1", "result": working}) + b"\n\n"
    server, _ = _card_agent(upstream, [event])
    gw = gateway(a2a_config(server.url.removesuffix("/v1")))

    async def scenario() -> str:
        async with sdk_client(gw.url + "/a2a/sdk") as client:
            with pytest.raises(InternalError) as info:  # -32603: the stream's error event
                await send(client, "hi")
            return str(info.value)

    assert "ended its stream" in asyncio.run(scenario())
    labels = {"agent": "sdk", "method": "SendStreamingMessage", "status": "cut"}
    assert sample(gw.url, "gateway_a2a_requests_total", **labels) == 1


def test_a_card_naming_another_host_moves_no_request_there(gateway, upstream):
    elsewhere = upstream(lambda req, writer: _never(req, writer))
    server, seen = _card_agent(upstream, [], card_url=elsewhere.url.removesuffix("/v1") + "/rpc")
    gw = gateway(a2a_config(server.url.removesuffix("/v1")))
    card = httpx.get(gw.url + "/a2a/sdk/.well-known/agent-card.json")
    assert card.status_code == 502 and card.json()["error"]["code"] == "a2a_card_unavailable"
    answer = rpc(gw.url, "SendMessage", {"message": {"messageId": "m", "parts": []}})
    assert answer.status_code == 502
    assert elsewhere.requests == [] and [r.method for r in seen] == ["GET", "GET"]


async def _never(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
    writer.write(http_response(500, b"{}"))
    return False


@pytest.mark.parametrize(
    "params",
    [
        {"message": {"messageId": "m", "task_id": "FOREIGN"}},  # the proto field name
        {"message": {"messageId": "m", "taskId": "x", "task_id": "FOREIGN"}},  # both spellings
        {"request": {"messageId": "m", "contextId": "FOREIGN"}},  # 0.3's proto name
        {"message": {"messageId": "m", "referenceTaskIds": ["FOREIGN"]}},
        {"message": {"messageId": "m", "reference_task_ids": ["FOREIGN"]}},
        {"message": {"messageId": "m", "taskId": ["FOREIGN"]}},  # not a string
    ],
)
def test_ids_spelled_another_way_are_still_checked(gateway, upstream, params):
    server, seen = _card_agent(upstream, [])
    gw = gateway(a2a_config(server.url.removesuffix("/v1"), extra=keys_section()))
    answer = rpc(gw.url, "SendMessage", params, KEY)
    assert answer.status_code == 200
    assert answer.json()["error"]["code"] in (-32001, -32602)
    assert not [r for r in seen if r.method == "POST"]  # never forwarded


def test_an_answer_naming_another_tenants_task_is_not_relayed(gateway, upstream):
    def answer(task: str) -> bytes:
        status = {"state": "TASK_STATE_COMPLETED"}
        result = {"task": {"id": task, "contextId": "c-" + task, "status": status}}
        return orjson.dumps({"jsonrpc": "2.0", "id": "1", "result": result})

    server, _ = _card_agent(upstream, [answer("t1"), answer("t1")])
    gw = gateway(a2a_config(server.url.removesuffix("/v1"), extra=keys_section()))
    msg = {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]}}
    assert rpc(gw.url, "SendMessage", msg, KEY).json()["result"]["task"]["id"] == "t1"
    stolen = rpc(gw.url, "SendMessage", msg, OTHER_KEY)  # the agent mixed its callers up
    assert stolen.status_code == 502 and stolen.json()["error"]["code"] == "a2a_foreign_id"


def test_unknown_methods_and_bad_bodies_are_refused_here(gateway, upstream):
    server, seen = _card_agent(upstream, [])
    gw = gateway(a2a_config(server.url.removesuffix("/v1")))
    assert rpc(gw.url, "tasks/send", {}).json()["error"]["code"] == -32601
    bad = httpx.post(gw.url + "/a2a/sdk", content=b"[1]", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == -32600
    batch = httpx.post(gw.url + "/a2a/sdk", content=b"{not json", timeout=10)
    assert batch.status_code == 400 and batch.json()["error"]["code"] == -32700
    rest = httpx.get(gw.url + "/a2a/sdk/tasks/x/pushNotificationConfigs", timeout=10)
    assert rest.status_code == 400
    assert rest.json()["error"]["details"][0]["reason"] == "PUSH_NOTIFICATION_NOT_SUPPORTED"
    assert httpx.get(gw.url + "/a2a/nobody/tasks/x", timeout=10).status_code == 404
    assert httpx.get(gw.url + "/a2a/sdk/tasks/x?id=y", timeout=10).status_code == 400
    assert not [r for r in seen if r.method == "POST"]
