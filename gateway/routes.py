"""Backends and routes as the request path sees them: configuration plus a pooled transport.

Data with no behaviour above it (docs/architecture.md, "The layer contract"), so the per-request
context can name them without importing any hop.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.config import BackendConfig, RouteConfig
from gateway.transports.base import Transport

log = logging.getLogger("gateway")

#: docs/spec.md §5: sent to ``provider = "anthropic"`` backends unless the client sent its own
ANTHROPIC_VERSION = ("anthropic-version", "2023-06-01")


class Backend:
    """A configured backend with its pooled transport (made once, in the lifespan)."""

    __slots__ = (
        "auth_header",
        "base_url",
        "config",
        "default_headers",
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
        self.host = parts.hostname or "mock"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        key = env.get(config.api_key_env) if config.api_key_env else None
        anthropic = config.provider == "anthropic"
        #: the backend's own key; no client credential ever goes upstream (docs/spec.md §5).
        #: Anthropic takes it as x-api-key (an Authorization header there is an OAuth token,
        #: not a key)
        self.auth_header: tuple[str, str] | None = None
        if key:
            self.auth_header = (
                ("x-api-key", key) if anthropic else ("authorization", f"Bearer {key}")
            )
        #: sent when the client's forwarded headers do not already name them
        self.default_headers: tuple[tuple[str, str], ...] = (
            (ANTHROPIC_VERSION,) if anthropic else ()
        )
        self.transport = transport

    def request_headers(self, forwarded: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The client's forwarded headers (lower-case names) plus this backend's key and the
        defaults the client did not send.

        >>> cfg = BackendConfig("a", "http://x", provider="anthropic", api_key_env="K")
        >>> b = Backend(cfg, None, {"K": "sk"})
        >>> b.request_headers([("x-request-id", "r")])
        [('x-request-id', 'r'), ('x-api-key', 'sk'), ('anthropic-version', '2023-06-01')]
        >>> b.request_headers([("anthropic-version", "2024-01-01")])
        [('anthropic-version', '2024-01-01'), ('x-api-key', 'sk')]
        """
        headers = forwarded
        if self.auth_header is not None:
            headers = [*headers, self.auth_header]
        for name, value in self.default_headers:
            if not any(k == name for k, _ in forwarded):
                headers = [*headers, (name, value)]
        return headers

    def url_for(self, path: str, query: bytes) -> str:
        """The request path after ``/v1`` appended to the configured base URL (docs/spec.md §4)."""
        url = self.base_url + path[3:]
        return f"{url}?{query.decode('latin-1')}" if query else url


@dataclass(frozen=True, slots=True)
class Route:
    config: RouteConfig
    backends: tuple[Backend, ...]
    #: the field ``max_tokens_cap`` sets when a chat request names no limit: the first
    #: backend's ``max_tokens_field`` (``gateway check-config`` refuses a route whose backends
    #: disagree), worked out once here, not per request
    tokens_field: str = field(init=False, default="max_tokens")

    def __post_init__(self) -> None:
        if self.backends:
            object.__setattr__(self, "tokens_field", self.backends[0].config.tokens_field)

    @property
    def name(self) -> str:
        return self.config.name

    def matches(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, p) for p in self.config.models)


def bearer_from_env(env: Mapping[str, str], var: str | None, owner: str) -> list[tuple[str, str]]:
    """``Authorization: Bearer`` from the environment variable ``var`` names (config names the
    variable, never the secret); a variable not set is one warning naming ``owner``, and no
    header.

    >>> bearer_from_env({"K": "s"}, "K", "agent a")
    [('authorization', 'Bearer s')]
    >>> bearer_from_env({}, None, "agent a")
    []
    """
    if not var:
        return []
    key = env.get(var)
    if key:
        return [("authorization", f"Bearer {key}")]
    log.warning("%s: env var %s is not set; no token is sent", owner, var)
    return []
