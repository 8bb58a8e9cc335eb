from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.config import load_config
from tests.support import GatewayServer


@pytest.fixture(scope="module")
def embedded() -> Iterator[GatewayServer]:
    """The gateway on the embedded default (``gateway serve`` with no config): the in-process
    mock answers every model."""
    server = GatewayServer(load_config(env={})).start()
    yield server
    server.stop()
