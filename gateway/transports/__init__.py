"""Upstream transports: one interface (:mod:`.base`), implementations side by side."""

from __future__ import annotations

from gateway.config import BackendConfig
from gateway.transports.base import Transport, UpstreamResponse

__all__ = ["Transport", "UpstreamResponse", "for_backend"]


def for_backend(backend: BackendConfig) -> Transport:
    """Pick the implementation for a backend (uvicorn's ``auto.py`` pattern)."""
    if backend.is_mock:
        from gateway.transports.mock_impl import MockTransport

        return MockTransport(backend)
    if backend.http2:
        from gateway.transports.httpx_impl import HttpxTransport

        return HttpxTransport(backend)
    if backend.http1_client == "aiohttp":
        from gateway.transports.aiohttp_impl import AiohttpTransport

        return AiohttpTransport(backend)
    from gateway.transports.http1_client import Http1ClientTransport

    return Http1ClientTransport(backend)
