"""``[[agents]]``: the A2A agents the gateway relays behind ``/a2a/{name}`` (docs/spec.md §4,
§30), and the checks their values' types cannot make."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.backends import split_url
from gateway.config.key_paths import KeyPathErrors


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """One upstream A2A agent (docs/spec.md §30)."""

    name: str
    #: the agent's base URL: its card is read from ``{url}/.well-known/agent-card.json``, and
    #: only the card's interfaces on this URL's origin are used (``mock://``: the built-in agent)
    url: str
    #: env var holding a bearer token sent as ``Authorization`` (never the client's)
    api_key_env: str | None = None
    #: a call's whole exchange may last this long; a stream may stay quiet this long per event
    timeout_s: float = 300.0
    #: a bigger request body, answer or stream event is refused
    max_message_bytes: int = 4 * 1024 * 1024
    #: how long the gateway remembers which tenant a task (or context) id belongs to
    task_ttl_s: float = 7 * 86400.0


def check_agents(agents: tuple[AgentConfig, ...], err: KeyPathErrors) -> None:
    names: set[str] = set()
    for i, a in enumerate(agents):
        p = f"agents[{i}]"
        # a name is one path segment of /a2a/{name}: no character that needs escaping
        if not a.name or not a.name.replace("-", "_").isidentifier():
            err(f"{p}.name", f"letters, digits, '-' and '_' only, got {a.name!r}")
        elif a.name in names:
            err(f"{p}.name", f"duplicate agent {a.name!r}")
        names.add(a.name)
        parts = split_url(a.url)
        if parts is None or parts.scheme not in ("http", "https", "mock"):
            err(f"{p}.url", f"scheme must be http, https or mock, got {a.url!r}")
        elif parts.scheme != "mock" and not parts.hostname:
            err(f"{p}.url", f"has no host: {a.url!r}")
        elif parts.query or parts.fragment or parts.username or parts.password:
            err(f"{p}.url", f"a base URL without query, fragment or credentials, got {a.url!r}")
        err.positive(a, p, "timeout_s", "max_message_bytes", "task_ttl_s")


__all__ = ["AgentConfig", "check_agents"]
