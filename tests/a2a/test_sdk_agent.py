"""The official ``a2a-sdk`` client, through the gateway, discovers and calls a real agent built
with the ``a2a-sdk`` server in another process (docs/spec.md §30): send, stream, get, cancel,
over JSON-RPC and HTTP+JSON, 1.0 and the 0.3 compatibility mode; the key's grants and the
tenants' tasks enforced; push configs refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import PushNotificationNotSupportedError, TaskNotFoundError

from tests.a2a.a2a_support import (
    AGENT_TOKEN,
    KEY,
    NO_AGENT_KEY,
    OTHER_KEY,
    SdkAgent,
    a2a_config,
    keys_section,
    last_state,
    message,
    sdk_client,
    send,
    task_of,
    text_of,
)


@pytest.fixture(scope="module")
def agent() -> Iterator[SdkAgent]:
    proc = SdkAgent()
    yield proc
    proc.stop()


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
def test_send_stream_get_and_cancel_through_the_gateway(gateway, agent, binding):
    gw = gateway(a2a_config(agent.url))
    url = gw.url + "/a2a/sdk"

    async def scenario() -> None:
        async with sdk_client(url, binding=binding) as client:
            streamed = await send(client, "hello gateway")
            assert text_of(streamed) == "hello gateway"
            assert last_state(streamed) == "TASK_STATE_COMPLETED"
            task_id, _ = task_of(streamed)
            task = await client.get_task(GetTaskRequest(id=task_id))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
        async with sdk_client(url, binding=binding, streaming=False) as client:
            (answer,) = await send(client, "one shot")
            assert text_of([answer]) == "one shot"
        async with sdk_client(url, binding=binding, streaming=False, polling=True) as client:
            (answer,) = await send(client, "wait")  # the task works until it is canceled
            task_id = answer.task.id
            canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            got = await client.get_task(GetTaskRequest(id=task_id))
            assert got.status.state == TaskState.TASK_STATE_CANCELED

    asyncio.run(scenario())
    seen = agent.seen()
    mine = [s for s in seen if s["path"].startswith("/rpc" if binding == "JSONRPC" else "/rest")]
    assert mine
    for s in mine:  # the agent's credential is the config's; the client's never reaches it
        assert s["headers"]["authorization"] == f"Bearer {AGENT_TOKEN}"


def test_the_card_points_at_the_gateway(gateway, agent):
    gw = gateway(a2a_config(agent.url, extra=keys_section()))

    async def scenario() -> dict:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
            card = await A2ACardResolver(http, gw.url + "/a2a/sdk").get_agent_card()
            raw = (await http.get(gw.url + "/a2a/sdk/.well-known/agent-card.json")).json()
        assert {i.url for i in card.supported_interfaces} == {gw.url + "/a2a/sdk"}
        assert {(i.protocol_binding, i.protocol_version) for i in card.supported_interfaces} == {
            ("JSONRPC", "1.0"), ("JSONRPC", "0.3"), ("HTTP+JSON", "1.0"), ("HTTP+JSON", "0.3"),
        }  # fmt: skip
        assert list(card.security_schemes) == ["gateway"]
        assert card.security_schemes["gateway"].http_auth_security_scheme.scheme == "Bearer"
        assert not card.capabilities.push_notifications
        return raw

    raw = asyncio.run(scenario())
    assert raw["url"] == gw.url + "/a2a/sdk"  # the 0.3 fields too
    assert {i["url"] for i in raw["additionalInterfaces"]} == {gw.url + "/a2a/sdk"}
    assert agent.url not in str(raw)


def test_the_0_3_compatibility_mode_is_relayed(gateway, agent):
    gw = gateway(a2a_config(agent.url))

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=20) as http:
            card = await A2ACardResolver(http, gw.url + "/a2a/sdk").get_agent_card()
            legacy = [i for i in card.supported_interfaces if i.protocol_version == "0.3"]
            del card.supported_interfaces[:]
            card.supported_interfaces.extend(legacy)
            for binding in ("JSONRPC", "HTTP+JSON"):
                config = ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])
                client = ClientFactory(config).create(card)
                events = await send(client, "old client")
                assert text_of(events) == "old client"
                task_id, _ = task_of(events)
                assert (await client.get_task(GetTaskRequest(id=task_id))).id == task_id

    asyncio.run(scenario())
    bodies = agent.bodies()
    assert '"method":"message/stream"' in bodies.replace(" ", "")
    assert "/rest/v1/message:stream" in bodies


def test_grants_and_tenants(gateway, agent):
    gw = gateway(a2a_config(agent.url, extra=keys_section()))
    url = gw.url + "/a2a/sdk"
    listed = httpx.get(gw.url + "/a2a", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert [a["name"] for a in listed["data"]] == ["sdk"]
    none = httpx.get(gw.url + "/a2a", headers={"Authorization": f"Bearer {NO_AGENT_KEY}"})
    assert none.json()["data"] == []
    card = httpx.get(url + "/.well-known/agent-card.json")
    assert card.status_code == 401
    denied = httpx.get(
        url + "/.well-known/agent-card.json", headers={"Authorization": f"Bearer {NO_AGENT_KEY}"}
    )
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "agent_not_allowed"

    async def mine() -> tuple[str, str]:
        async with sdk_client(url, KEY) as client:
            return task_of(await send(client, "tenant a's"))

    task_id, context_id = asyncio.run(mine())
    before = len(agent.seen())
    for binding in ("JSONRPC", "HTTP+JSON"):
        asyncio.run(_refused_everywhere(url, binding, task_id, context_id))
    assert len(agent.seen()) == before  # none of it reached the agent
    # the owner still gets it
    assert asyncio.run(_get(url, KEY, task_id)) == task_id


async def _get(url: str, key: str, task_id: str) -> str:
    async with sdk_client(url, key) as client:
        return (await client.get_task(GetTaskRequest(id=task_id))).id


async def _refused_everywhere(url: str, binding: str, task_id: str, context_id: str) -> None:
    """Tenant b names tenant a's task (and context) in every place a task id appears."""
    async with sdk_client(url, OTHER_KEY, binding=binding) as client:
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id=task_id))
        with pytest.raises(TaskNotFoundError):
            await client.cancel_task(CancelTaskRequest(id=task_id))
        with pytest.raises((TaskNotFoundError, A2AClientError)):
            _ = [e async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]
        for ids in ({"task_id": task_id}, {"context_id": context_id}):
            with pytest.raises(TaskNotFoundError):
                await send(client, "hijack", **ids)
        request = message("refer")
        request.message.reference_task_ids.append(task_id)
        with pytest.raises(TaskNotFoundError):
            _ = [e async for e in client.send_message(request)]
        with pytest.raises(TaskNotFoundError):  # an id nobody made: not forwarded either
            await client.get_task(GetTaskRequest(id="00000000-0000-0000-0000-000000000000"))


def test_push_configs_are_refused_and_never_reach_the_agent(gateway, agent):
    gw = gateway(a2a_config(agent.url, extra=keys_section()))
    url = gw.url + "/a2a/sdk"
    internal = "http://127.0.0.1:6379/internal-hook"

    async def scenario() -> None:
        for binding in ("JSONRPC", "HTTP+JSON"):
            async with sdk_client(url, KEY, binding=binding) as client:
                task_id, _ = task_of(await send(client, "hook me"))
                config = TaskPushNotificationConfig(task_id=task_id, url=internal)
                with pytest.raises(PushNotificationNotSupportedError):
                    await client.create_task_push_notification_config(config)
                request = message("with a hook")
                request.configuration.task_push_notification_config.url = internal
                with pytest.raises(PushNotificationNotSupportedError):
                    _ = [e async for e in client.send_message(request)]

    asyncio.run(scenario())
    assert internal not in agent.bodies()


def test_rpm_counts_messages_only(gateway, agent):
    gw = gateway(a2a_config(agent.url, extra=keys_section(rpm=2)))
    url = gw.url + "/a2a/sdk"

    async def scenario() -> list[str]:
        outcomes = []
        async with sdk_client(url, KEY) as client:
            task_id, _ = task_of(await send(client, "one"))
            for _ in range(3):  # reads are not counted
                await client.get_task(GetTaskRequest(id=task_id))
            for text in ("two", "three"):
                try:
                    outcomes.append(text_of(await send(client, text)))
                except A2AClientError as exc:
                    outcomes.append(str(exc))
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes[0] == "two" and "429" in outcomes[1]
