"""A real A2A agent (``tests/a2a/agent_server.py``, the official ``a2a-sdk`` server) in a process
of its own, and the official ``a2a-sdk`` client pointed at the gateway.

The agent records what reached it (``SdkAgent.seen``), so a test proves what was — and was
not — forwarded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types import Message, Part, Role, SendMessageRequest, StreamResponse

from gateway.config import Config
from tests.support import free_port, gateway_config, wait_port

ROOT = Path(__file__).resolve().parent.parent.parent
KEY = "sk-a2a-tenant-a"
OTHER_KEY = "sk-a2a-tenant-b"
#: a key of tenant a that may call no agent
NO_AGENT_KEY = "sk-a2a-no-agents"
AGENT_TOKEN = "agent-token-from-config"
os.environ["TEST_A2A_AGENT_TOKEN"] = AGENT_TOKEN


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class SdkAgent:
    """``python -m tests.a2a.agent_server PORT``, stopped by its own PID."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.a2a.agent_server", str(self.port)], cwd=ROOT
        )
        wait_port(self.port, 30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def seen(self) -> list[dict[str, Any]]:
        return list(httpx.get(self.url + "/_seen", timeout=10).json())

    def bodies(self) -> str:
        """Every request body the agent got, as one text (to prove an id never reached it)."""
        return "\n".join(s["body"] + s["path"] + s["query"] for s in self.seen())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def keys_section(rpm: int | None = None) -> str:
    limit = f"rpm = {rpm}\n" if rpm is not None else ""
    return f"""
[auth]
mode = "keys"

[[auth.keys]]
tenant = "a"
sha256 = "{sha(KEY)}"
agents = ["sd*"]
{limit}
[[auth.keys]]
tenant = "b"
sha256 = "{sha(OTHER_KEY)}"
agents = ["*"]

[[auth.keys]]
tenant = "a"
sha256 = "{sha(NO_AGENT_KEY)}"
"""


def a2a_config(agent_url: str, extra: str = "", agent_extra: str = "") -> Config:
    return gateway_config(
        f"""
[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
name = "default"
models = ["*"]
backends = ["mock"]

[[agents]]
name = "sdk"
url = "{agent_url}"
api_key_env = "TEST_A2A_AGENT_TOKEN"
{agent_extra}
{extra}
"""
    )


@contextlib.asynccontextmanager
async def sdk_client(
    url: str, key: str | None = None, *, streaming: bool = True, binding: str = "JSONRPC",
    polling: bool = False,
) -> AsyncIterator[Client]:  # fmt: skip
    """The SDK's client for the agent at ``url`` (its card read from there), with ``key``."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(headers=headers, timeout=20) as http:
        config = ClientConfig(
            httpx_client=http,
            streaming=streaming,
            polling=polling,
            supported_protocol_bindings=[binding],
        )
        client = await ClientFactory(config).create_from_url(url)
        yield client


def message(text: str, **ids: str) -> SendMessageRequest:
    msg = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    for name, value in ids.items():
        setattr(msg, name, value)
    return SendMessageRequest(message=msg)


async def send(client: Client, text: str, **ids: str) -> list[StreamResponse]:
    return [event async for event in client.send_message(message(text, **ids))]


def text_of(events: list[StreamResponse]) -> str:
    """The answer's text: a task's artifacts, or the artifact chunks of a stream."""
    out = []
    for event in events:
        if event.HasField("task"):
            out += [p.text for a in event.task.artifacts for p in a.parts]
        elif event.HasField("artifact_update"):
            out += [p.text for p in event.artifact_update.artifact.parts]
    return "".join(out)


def task_of(events: list[StreamResponse]) -> tuple[str, str]:
    """(task id, context id) of a send's answer."""
    for event in events:
        if event.HasField("task"):
            return event.task.id, event.task.context_id
    raise AssertionError("no task in the answer")


def last_state(events: list[StreamResponse]) -> str:
    from a2a.types import TaskState

    for event in reversed(events):
        if event.HasField("status_update"):
            return str(TaskState.Name(event.status_update.status.state))
        if event.HasField("task"):
            return str(TaskState.Name(event.task.status.state))
    raise AssertionError("no state in the answer")
