"""Answers to the client: the SSE relay (:mod:`.relay`), JSON and raw bodies (:mod:`.bodies`),
the SSE parser (:mod:`.sse`)."""

from __future__ import annotations

from gateway.streaming.sse import DONE, SSEParser, event_data, event_name

__all__ = ["DONE", "SSEParser", "event_data", "event_name"]
