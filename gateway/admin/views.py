"""What the admin API shows of a record (never a secret nor its digest) and the audit line of
each change (docs/spec.md §28)."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.config import AuthKeyConfig, Config, TenantConfig
from gateway.keys.records import Record

audit_log = logging.getLogger("gateway.audit")

_KEY_SHOWN = (
    *("tenant", "prefix", "models", "rpm", "tpm", "budget_usd", "budget_period"),
    *("mcp_servers", "mcp_tools", "passthrough", "agents"),
)
_TENANT_SHOWN = ("budget_usd", "budget_period", "mcp_servers", "mcp_tools", "passthrough")


def iso(at: float | None) -> str | None:
    if at is None:
        return None
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):  # a record written before expires_at was bounded
        return f"{at:.0f}"


def key_view(record: Record) -> dict[str, Any]:
    now = time.time()
    view: dict[str, Any] = {"id": record["id"], "object": "gateway.key", "managed_by": "api"}
    view.update({f: record.get(f) for f in _KEY_SHOWN})
    expires = record.get("expires_at")
    view["expires_at"] = iso(expires)
    view["expired"] = expires is not None and now >= expires
    view["blocked"] = bool(record.get("blocked"))
    view["metadata"] = record.get("metadata") or {}
    view["grace_until"] = [iso(until) for _, until in record.get("old", ()) if until > now]
    view["created_at"] = iso(record.get("created_at"))
    view["updated_at"] = iso(record.get("updated_at"))
    view["version"] = record.get("version")
    return view


def config_key_id(k: AuthKeyConfig) -> str:
    return "config_" + k.sha256[:12].lower()


def config_key_view(k: AuthKeyConfig) -> dict[str, Any]:
    return {
        "id": config_key_id(k),
        "object": "gateway.key",
        "managed_by": "config",
        "tenant": k.tenant,
        "prefix": None,
        "models": list(k.models),
        "rpm": k.rpm,
        "tpm": k.tpm,
        "budget_usd": k.budget_usd,
        "budget_period": k.budget_period,
        "admin": k.admin,
        "mcp_servers": list(k.mcp_servers),
        "mcp_tools": list(k.mcp_tools),
        "passthrough": list(k.passthrough) if k.passthrough is not None else None,
        "agents": list(k.agents),
        "expires_at": None,
        "blocked": False,
        "metadata": {},
    }


def tenant_view(record: Record) -> dict[str, Any]:
    view: dict[str, Any] = {"name": record["name"], "object": "gateway.tenant"}
    view["managed_by"] = "api"
    view.update({f: record.get(f) for f in (*_TENANT_SHOWN, "agents", "metadata")})
    view["created_at"] = iso(record.get("created_at"))
    view["updated_at"] = iso(record.get("updated_at"))
    view["version"] = record.get("version")
    return view


def config_tenant_view(t: TenantConfig) -> dict[str, Any]:
    view: dict[str, Any] = {"name": t.name, "object": "gateway.tenant", "managed_by": "config"}
    view.update({f: getattr(t, f) for f in _TENANT_SHOWN})
    view["agents"] = t.agents
    return view


def config_tenant(config: Config, tenant: str) -> TenantConfig | None:
    return next((t for t in config.auth.tenants if t.name == tenant), None)


def audit(who: str, action: str, target: str, before: Any, after: Any) -> None:
    """One line per change: who, what, before → after (views: no secret, no digest)."""
    line = {"audit": action, "who": who, "target": target, "before": before, "after": after}
    audit_log.info("admin %s", orjson.dumps(line).decode())


__all__ = [
    "audit",
    "config_key_id",
    "config_key_view",
    "config_tenant",
    "config_tenant_view",
    "iso",
    "key_view",
    "tenant_view",
]
