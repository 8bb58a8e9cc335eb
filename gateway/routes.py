"""Backends and routes as the request path sees them: configuration plus a pooled transport.

Data with no behaviour above it (DESIGN: "Backend/Route in a low module"), so the per-request
context can name them without importing any hop.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.config import BackendConfig, RouteConfig
from gateway.transports.base import Transport


class Backend:
    """A configured backend with its pooled transport (made once, in the lifespan)."""

    __slots__ = (
        "auth_header",
        "base_path",
        "base_url",
        "config",
        "host",
        "name",
        "port",
        "provider",
        "transport",
    )

    def __init__(
        self,
        config: BackendConfig,
        transport: Transport,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.config = config
        self.name = config.name
        self.provider = config.provider
        self.base_url = config.url.split("?", 1)[0].rstrip("/")
        parts = urlsplit(config.url)
        self.base_path = parts.path.rstrip("/")
        self.host = parts.hostname or "mock"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        key = env.get(config.api_key_env) if config.api_key_env else None
        #: the backend's own key; no client credential ever goes upstream (SPEC §5)
        self.auth_header: tuple[str, str] | None = (
            ("authorization", f"Bearer {key}") if key else None
        )
        self.transport = transport

    def url_for(self, path: str, query: bytes) -> str:
        """The request path after ``/v1`` appended to the configured base URL (SPEC §4)."""
        url = self.base_url + path[3:]
        return f"{url}?{query.decode('latin-1')}" if query else url


@dataclass(frozen=True, slots=True)
class Route:
    config: RouteConfig
    backends: tuple[Backend, ...]

    @property
    def name(self) -> str:
        return self.config.name

    def matches(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, p) for p in self.config.models)
