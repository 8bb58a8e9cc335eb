"""Fixtures of the MCP tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gateway.telemetry.logs import ACCESS_LOGGER


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(record.getMessage()))


@pytest.fixture
def access_lines() -> Iterator[list[dict[str, Any]]]:
    """The access-log lines the gateways of the test write (parsed)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    handler = _Lines()
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
