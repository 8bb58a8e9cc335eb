from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from gateway.config import Config
from gateway.telemetry.logs import ACCESS_LOGGER
from tests.model_api_support import engine_upstream
from tests.otlp_receiver import OTLPReceiver
from tests.redis_support import RedisServer
from tests.support import (
    GatewayServer,
    Handler,
    Process,
    ScriptedUpstream,
    free_port,
    gateway_cli,
)

#: the key backends send upstream in tests (configs name it with api_key_env)
BACKEND_KEY = "sk-backend-secret-for-tests"
os.environ["TEST_BACKEND_KEY"] = BACKEND_KEY


@pytest.fixture(scope="session")
def mock_upstream() -> Iterator[Process]:
    """``gateway mock-upstream`` as its own process (the upstream is a separate server)."""
    port = free_port()
    proc = Process(gateway_cli("mock-upstream", "--port", str(port)), port)
    yield proc
    proc.stop()


@pytest.fixture
def gateway() -> Iterator[Callable[[Config], GatewayServer]]:
    """Factory: start the gateway for a config as a real server on a loopback port."""
    servers: list[GatewayServer] = []

    def start(config: Config) -> GatewayServer:
        server = GatewayServer(config).start()
        servers.append(server)
        return server

    yield start
    for s in reversed(servers):
        s.stop()


@pytest.fixture
def upstream() -> Iterator[Callable[[Handler], ScriptedUpstream]]:
    """Factory: a scripted HTTP/1.1 upstream on a loopback port."""
    servers: list[ScriptedUpstream] = []

    def start(handler: Handler) -> ScriptedUpstream:
        server = ScriptedUpstream(handler).start()
        servers.append(server)
        return server

    yield start
    for s in reversed(servers):
        s.stop()


@pytest.fixture
def ups(
    upstream: Callable[[Handler], ScriptedUpstream],
) -> tuple[ScriptedUpstream, ScriptedUpstream]:
    """Two scripted upstreams answering with the mock engine, recording what they got: (claude,
    gpt) in the model-API tests."""
    return upstream(engine_upstream()), upstream(engine_upstream())


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    """The suite's OTLP/HTTP receiver: the spans the gateways of the test export."""
    with OTLPReceiver("http") as r:
        yield r


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    """A ``redis-server`` of the test's own, on a free loopback port."""
    with RedisServer() as server:
        yield server


def pytest_report_header(config: Any) -> str:
    return "llm-gateway tests; backend key env TEST_BACKEND_KEY set"


@pytest.fixture(autouse=True)
def _close_sync_sdk_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close every sync ``openai.OpenAI`` / ``anthropic.Anthropic`` a test made, at its end.

    Tests make SDK clients inline, as applications do; left to the garbage collector, a pooled
    keep-alive socket of one can be finalised during a later test and fail it with a
    ResourceWarning (``filterwarnings = error``). Closing them here keeps each test's sockets
    its own.
    """
    import anthropic
    import openai

    made: list[Any] = []
    for cls in (openai.OpenAI, anthropic.Anthropic):
        original = cls.__init__

        def init(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> None:
            __original(self, *args, **kwargs)
            made.append(self)

        monkeypatch.setattr(cls, "__init__", init)
    yield
    for client in made:
        client.close()


class _AccessLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(record.getMessage()))


@pytest.fixture
def access_lines() -> Iterator[list[dict[str, Any]]]:
    """The access-log lines the in-process gateways of the test write (parsed)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    handler = _AccessLines()
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
