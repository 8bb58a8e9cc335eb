"""Who may use which MCP server and tool, and which browser origins may call at all
(docs/spec.md §23).

A tool ``t`` of server ``s`` is served when all of these say yes:

- the server's ``tools_allow`` globs match ``t`` and its ``tools_deny`` globs do not;
- with ``auth.mode = "keys"``: the caller's key lists ``s`` in ``mcp_servers`` (none by
  default) and matches ``s__t`` in ``mcp_tools``; its tenant's ``mcp_servers`` / ``mcp_tools``,
  when set, narrow that further. With auth off every server is open.

A denied tool is absent from ``tools/list`` and a call to it is a JSON-RPC error, never
forwarded. The decision per (server, tool) is memoised per caller (bounded).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from gateway.config import Config, McpServerConfig
from gateway.hops.auth import KeyEntry
from gateway.memo import remember

_MEMO_MAX = 4096
SEPARATOR = "__"


def _any(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


class Grant:
    """What one caller (a key, or everybody with auth off) may use."""

    __slots__ = ("_memo", "owner", "servers", "tools")

    def __init__(
        self, owner: str, servers: Sequence[Sequence[str]], tools: Sequence[Sequence[str]]
    ):
        #: whose sessions these are (a key's limiter id, "-" with auth off): never shared
        self.owner = owner
        #: every glob list must match (the key's, then its tenant's when set)
        self.servers = servers
        self.tools = tools
        self._memo: dict[tuple[str, str | None], bool] = {}

    def owned_by(self, owner: str) -> Grant:
        """The same grant for another owner: a signed-in subject holds its grant's policy, and
        its MCP sessions are its own (docs/spec.md §29)."""
        return self if owner == self.owner else Grant(owner, self.servers, self.tools)

    def server(self, name: str) -> bool:
        return self.tool(name, None)

    def tool(self, server: str, tool: str | None) -> bool:
        key = (server, tool)
        ok = self._memo.get(key)
        if ok is None:
            ok = all(_any(server, globs) for globs in self.servers)
            if ok and tool is not None:
                full = f"{server}{SEPARATOR}{tool}"
                ok = all(_any(full, globs) for globs in self.tools)
            remember(self._memo, key, ok, _MEMO_MAX)  # tool names come from clients: bounded
        return ok


EVERYBODY = Grant("-", [("*",)], [("*",)])


class Access:
    """The grants of a config: per key (by its sha256), or one for everybody with auth off."""

    def __init__(self, config: Config) -> None:
        self.servers = {s.name: s for s in config.mcp_servers}
        self.keys_on = config.auth.mode == "keys"
        tenants = {t.name: t for t in config.auth.tenants}
        self._grants: dict[str, Grant] = {}
        for k in config.auth.policies():  # the keys, and the sign-in grants (docs/spec.md §29)
            servers: list[Sequence[str]] = [k.mcp_servers]
            tools: list[Sequence[str]] = [k.mcp_tools]
            t = tenants.get(k.tenant)
            if t is not None and t.mcp_servers is not None:
                servers.append(t.mcp_servers)
            if t is not None and t.mcp_tools is not None:
                tools.append(t.mcp_tools)
            self._grants[k.sha256.lower()] = Grant(k.sha256[:32].lower(), servers, tools)

    def grant(self, digest_hex: str | None) -> Grant:
        """The caller's grant (``digest_hex``: its key's sha256, known once auth identified it)."""
        if not self.keys_on or digest_hex is None:
            return EVERYBODY
        return self._grants.get(digest_hex, Grant(digest_hex[:32], [()], [()]))

    def grant_of(self, entry: KeyEntry) -> Grant:
        """The grant of an identified caller: a key of the key store carries its own
        (docs/spec.md §28), the others are found by digest."""
        own = entry.own
        if own is not None:
            return Grant(entry.limit_id, own.mcp_servers, own.mcp_tools)
        return self.grant(entry.digest.hex())

    def served(self, server: McpServerConfig, tool: str) -> bool:
        """The server's own allow/deny globs."""
        return _any(tool, server.tools_allow) and not _any(tool, server.tools_deny)


def origin_allowed(origin: str | None, allowed: Iterable[str]) -> bool:
    """DNS-rebinding protection (MCP transport spec, "Security warning"): a request without an
    ``Origin`` (no browser) passes; a browser's must be a loopback origin or listed.

    >>> origin_allowed(None, ()), origin_allowed("http://localhost:3000", ())
    (True, True)
    >>> origin_allowed("https://evil.example", ()), origin_allowed("https://a.example", ["https://a.example"])
    (False, True)
    """
    if origin is None:
        return True
    if origin in allowed:
        return True
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")


__all__ = ["EVERYBODY", "SEPARATOR", "Access", "Grant", "origin_allowed"]
