"""Fixtures of the realtime tests: independent realtime upstreams, stopped by their handle."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.realtime_support import RealtimeUpstream


@pytest.fixture
def realtime_upstream() -> Iterator[Callable[..., RealtimeUpstream]]:
    started: list[RealtimeUpstream] = []

    def start(**kwargs: Any) -> RealtimeUpstream:
        up = RealtimeUpstream(**kwargs).start()
        started.append(up)
        return up

    yield start
    for up in started:
        up.stop()
