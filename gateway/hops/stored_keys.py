"""The key store's keys as the auth hop sees them (docs/spec.md §28).

:meth:`StoredEntries.find` is one dict lookup in the process's index
(:class:`gateway.keys.KeyIndex`): no store round trip per request. A key's
:class:`~gateway.hops.auth.KeyEntry` is built once per change of the index (the limits and
budgets named by the key's id, so a rotation keeps its counts and its spend; its tenant's
budget from the ``[[auth.tenants]]`` of the config, else from the store's tenant), then reused.
A blocked or expired key is refused with 401 ``key_blocked`` / ``key_expired``, a key whose
store tenant was deleted with 401 ``tenant_deleted`` (fail closed: it would lose the tenant's
budget and grant narrowing); a rotated secret past its grace, a deleted key, is unknown (401
``invalid_api_key``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from gateway.budgets.limits import Budget
from gateway.config import AuthKeyConfig, TenantConfig
from gateway.errors import Unauthorized
from gateway.hops.auth import KeyEntry, tenant_budget
from gateway.keys import KeyIndex
from gateway.keys.records import OwnGrants, Record

#: the grants a tenant narrows
_NARROWED = ("mcp_servers", "mcp_tools", "passthrough", "agents")
Period = Literal["day", "week", "month", "total"]
_PERIODS: dict[str, Period] = {"day": "day", "week": "week", "month": "month", "total": "total"}


def limit_id(key_id: str) -> str:
    """The limiter's name for a key of the store: stable across its rotations."""
    return hashlib.sha256(b"stored key\0" + key_id.encode()).hexdigest()[:32]


def key_policy(record: Record) -> AuthKeyConfig:
    """A key record as the policy a config key would be."""
    period = _PERIODS.get(record.get("budget_period") or "", "month")
    return AuthKeyConfig(
        tenant=record["tenant"],
        sha256=record["digest"],
        models=tuple(record.get("models") or ("*",)),
        rpm=record.get("rpm"),
        tpm=record.get("tpm"),
        budget_usd=record.get("budget_usd"),
        budget_period=period,
        mcp_servers=tuple(record.get("mcp_servers") or ()),
        mcp_tools=tuple(record.get("mcp_tools") or ("*",)),
    )


def stored_tenant_budget(record: Record) -> Budget | None:
    period = _PERIODS.get(record.get("budget_period") or "", "month")
    return tenant_budget(
        TenantConfig(
            name=record["name"],
            budget_usd=record.get("budget_usd"),
            budget_period=period,
        )
    )


class StoredEntries:
    """The entries of the key store's keys, for :class:`gateway.hops.auth.Auth`."""

    __slots__ = ("_built", "_config_tenants", "_generation", "_tenant_configs", "index")

    def __init__(
        self,
        index: KeyIndex,
        config_tenants: Mapping[str, Budget],
        tenant_configs: Sequence[TenantConfig] = (),
    ) -> None:
        self.index = index
        #: the config's tenant budgets: a tenant of the config is managed by it
        self._config_tenants = config_tenants
        self._tenant_configs = {t.name: t for t in tenant_configs}
        self._built: dict[str, KeyEntry] = {}
        self._generation = -1

    def find(self, digest: bytes) -> KeyEntry | None:
        slot = self.index.by_digest.get(digest)
        if slot is None:
            return None
        record, until = slot
        now = time.time()
        if now >= until:  # a rotated secret past its grace
            return None
        if record.get("blocked"):
            raise Unauthorized("this API key is blocked", code="key_blocked")
        expires = record.get("expires_at")
        if expires is not None and now >= expires:
            raise Unauthorized(f"this API key expired at {_iso(expires)}", code="key_expired")
        tenant = record["tenant"]
        if tenant not in self._config_tenants and tenant not in self._tenant_configs:
            held = self.index.records.get("t:" + tenant)
            if held is not None and held.get("deleted"):  # fail closed: no budget, no narrowing
                raise Unauthorized("this API key's tenant was deleted", code="tenant_deleted")
        return self.entry(record)

    def entry(self, record: Record) -> KeyEntry:
        if self._generation != self.index.generation:
            self._built.clear()
            self._generation = self.index.generation
        entry = self._built.get(record["id"])
        if entry is None:
            of_tenant = self.tenant(record["tenant"])
            policy = key_policy(record)
            entry = KeyEntry(policy, of_tenant, limit_id(record["id"]))
            entry.own = self._grants(record, policy)
            self._built[record["id"]] = entry
        return entry

    def _grants(self, record: Record, policy: AuthKeyConfig) -> OwnGrants:
        """The key's grants (docs/spec.md §23, §26, §30), narrowed by its tenant's when set:
        the config's tenant of that name, else the store's."""
        passthrough = record.get("passthrough")
        own = OwnGrants(
            [policy.mcp_servers],
            [policy.mcp_tools],
            [tuple(passthrough) if passthrough is not None else ()],
            [tuple(record.get("agents") or ())],
        )
        configured = self._tenant_configs.get(policy.tenant)
        tenant: Mapping[str, Any] = {}
        if configured is not None:
            tenant = {f: getattr(configured, f) for f in _NARROWED}
        else:
            tenant = self.index.get("t:" + policy.tenant) or {}
        for field in _NARROWED:
            narrow = tenant.get(field)
            if narrow is not None:
                getattr(own, field).append(tuple(narrow))
        return own

    def tenant(self, name: str) -> Budget | None:
        if name in self._config_tenants:
            return self._config_tenants[name]
        record = self.index.get("t:" + name)
        return stored_tenant_budget(record) if record is not None else None

    def budgets(self) -> list[tuple[str, str | None, Budget]]:
        rows: list[tuple[str, str | None, Budget]] = []
        for t in self.index.tenant_records():
            if t["name"] not in self._config_tenants and (b := stored_tenant_budget(t)):
                rows.append((t["name"], None, b))
        for k in self.index.key_records():
            own = self.entry(k).allowance.key_budget
            if own is not None:
                rows.append((k["tenant"], k["id"], own))
        return rows


def _iso(at: float) -> str:
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):  # a record written before expires_at was bounded
        return f"{at:.0f} (Unix s)"


__all__ = ["StoredEntries", "key_policy", "limit_id", "stored_tenant_budget"]
