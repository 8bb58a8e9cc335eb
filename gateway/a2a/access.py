"""Who may call which agent (docs/spec.md §30).

With ``auth.mode = "keys"`` an agent is callable when the caller's key lists it in ``agents``
(globs over agent names; none by default) and, when its tenant sets ``agents``, the tenant's
list matches it too. With auth off every agent is open. The decision per agent is memoised per
key (agent names come from the config, so the memo is bounded by it).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from gateway.config import Config
from gateway.hops.auth import KeyEntry


class AgentGrant:
    """What one caller (a key, or everybody with auth off) may call."""

    __slots__ = ("_lists", "_memo")

    def __init__(self, lists: Sequence[Sequence[str]]) -> None:
        #: every glob list must match (the key's, then its tenant's when set)
        self._lists = lists
        self._memo: dict[str, bool] = {}

    def agent(self, name: str) -> bool:
        ok = self._memo.get(name)
        if ok is None:
            ok = all(any(fnmatch.fnmatchcase(name, g) for g in globs) for globs in self._lists)
            if len(self._memo) < 4096:
                self._memo[name] = ok
        return ok


EVERYBODY = AgentGrant([("*",)])
NOBODY = AgentGrant([()])


class AgentAccess:
    """The grants of a config: per key (by its sha256), or one for everybody with auth off."""

    def __init__(self, config: Config) -> None:
        self.keys_on = config.auth.mode == "keys"
        tenants = {t.name: t for t in config.auth.tenants}
        self._grants: dict[str, AgentGrant] = {}
        for k in config.auth.policies():  # the keys, and the sign-in grants (docs/spec.md §29)
            lists: list[Sequence[str]] = [k.agents]
            t = tenants.get(k.tenant)
            if t is not None and t.agents is not None:
                lists.append(t.agents)
            self._grants[k.sha256.lower()] = AgentGrant(lists)

    def grant(self, digest_hex: str | None) -> AgentGrant:
        """The caller's grant (``digest_hex``: its key's sha256, known once auth identified it)."""
        if not self.keys_on:
            return EVERYBODY
        if digest_hex is None:
            return NOBODY
        return self._grants.get(digest_hex, NOBODY)

    def grant_of(self, entry: KeyEntry) -> AgentGrant:
        """An identified caller's: a key of the key store carries its own (docs/spec.md §28)."""
        if entry.own is not None:
            return AgentGrant(entry.own.agents) if self.keys_on else EVERYBODY
        return self.grant(entry.digest.hex())


__all__ = ["EVERYBODY", "NOBODY", "AgentAccess", "AgentGrant"]
