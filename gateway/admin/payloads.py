"""The admin API's request bodies, checked field by field (docs/spec.md §28): every value
bounded (lengths, counts, the metadata's size), every problem a 400 naming the field."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from gateway.errors import GatewayError, InvalidRequest
from gateway.hops.router import json_object
from gateway.keys.records import KEY_ID_RE, NAME_RE

PERIODS: Final = ("day", "week", "month", "total")
MAX_GLOBS: Final = 64
MAX_GLOB: Final = 200
MAX_METADATA: Final = 4096
#: how deep metadata may nest (the object itself is 1)
MAX_DEPTH: Final = 16
#: the latest ``expires_at``: 9999-12-31T23:59:59Z, in Unix seconds
MAX_EXPIRES: Final = 253402300799
#: the longest grace a rotation may give the old secret (30 days)
MAX_GRACE_S: Final = 30 * 86400

KEY_FIELDS: Final = frozenset(
    {"tenant", "models", "budget_usd", "budget_period", "rpm", "tpm", "expires_at", "metadata"}
) | {"mcp_servers", "mcp_tools", "passthrough", "agents"}
TENANT_FIELDS: Final = frozenset(
    {"name", "budget_usd", "budget_period", "mcp_servers", "mcp_tools", "passthrough", "agents"}
) | {"metadata"}


class AdminConflict(GatewayError):
    status = 409
    type = "conflict_error"


class StoreUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    should_retry = True


def parse_object(raw: bytes) -> dict[str, Any]:
    """The body as one JSON object (the router's rule, :func:`json_object`); none: ``{}``."""
    return json_object(raw) if raw.strip() else {}


def _bad(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", code="invalid_field")


def name(value: Any, field: str = "name") -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise _bad(field, "1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit")
    return value


def _globs(
    value: Any, field: str, allow_none: bool = False, allow_empty: bool = False
) -> list[str] | None:
    if value is None and allow_none:
        return None
    empty = not value and not allow_empty
    if not isinstance(value, list) or empty or len(value) > MAX_GLOBS:
        raise _bad(field, f"a list of 1..{MAX_GLOBS} globs")
    if not all(isinstance(g, str) and 0 < len(g) <= MAX_GLOB for g in value):
        raise _bad(field, f"each glob is a non-empty string of at most {MAX_GLOB} characters")
    return list(value)


def _paths(value: Any, field: str) -> list[str] | None:
    globs = _globs(value, field, allow_none=True, allow_empty=True)
    if globs is not None and not all(g.startswith(("/", "*")) for g in globs):
        raise _bad(field, "each entry is a path glob starting with '/' (or '*')")
    return globs


def _count(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**9:
        raise _bad(field, "an integer >= 1, or null")
    return value


def _usd(value: Any, field: str = "budget_usd") -> float | None:
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 < value <= 1e9:
        raise _bad(field, "a number of USD > 0, or null")
    return float(value)


def _period(value: Any) -> str:
    if value not in PERIODS:
        raise _bad("budget_period", f"one of {', '.join(PERIODS)}")
    return str(value)


def expires(value: Any) -> float | None:
    """``expires_at``: RFC 3339 text or Unix seconds (null: never), within 1970..9999 (so
    milliseconds, or a value no date can show, are a 400 rather than a record every read fails
    on)."""
    if value is None:
        return None
    at: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        at = float(value)
    elif isinstance(value, str) and len(value) <= 40:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            at = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    if at is None or not 0 <= at <= MAX_EXPIRES:
        raise _bad(
            "expires_at",
            f"an RFC 3339 time (2030-01-01T00:00:00Z), Unix seconds within 0..{MAX_EXPIRES}, "
            "or null",
        )
    return at


def _metadata(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    problem = f"a JSON object of at most {MAX_METADATA} bytes, nested at most {MAX_DEPTH} deep"
    if not isinstance(value, dict) or _depth(value) > MAX_DEPTH:
        raise _bad("metadata", problem)
    try:
        size = len(orjson.dumps(value))
    except orjson.JSONEncodeError:
        raise _bad("metadata", problem) from None
    if size > MAX_METADATA:
        raise _bad("metadata", problem)
    return value


def _depth(value: Any) -> int:
    """How deep ``value`` nests (stops counting past :data:`MAX_DEPTH`)."""
    depth, level = 0, [value]
    while level and depth <= MAX_DEPTH:
        depth += 1
        nested: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                nested.extend(v.values())
            elif isinstance(v, list):
                nested.extend(v)
        level = [v for v in nested if isinstance(v, dict | list)]
    return depth


def grace(body: dict[str, Any]) -> float:
    value = body.get("grace_s", 0)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 <= value <= MAX_GRACE_S:
        raise _bad("grace_s", f"seconds within 0..{MAX_GRACE_S}")
    return float(value)


def _unknown(body: dict[str, Any], allowed: frozenset[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise _bad(extra[0][:64], "not a field of this object")


def key_fields(body: dict[str, Any], partial: bool) -> dict[str, Any]:
    """The fields of a key's create (all but ``tenant`` optional) or update (``partial``)."""
    _unknown(body, KEY_FIELDS - ({"tenant"} if partial else set()))
    out: dict[str, Any] = {}
    if not partial:
        out["tenant"] = name(body.get("tenant"), "tenant")
    checks: dict[str, Callable[[Any], Any]] = {
        "models": lambda v: _globs(v, "models"),
        "rpm": lambda v: _count(v, "rpm"),
        "tpm": lambda v: _count(v, "tpm"),
        "budget_usd": _usd,
        "budget_period": _period,
        "expires_at": expires,
        "metadata": _metadata,
        # docs/spec.md §23: none unless listed; the tools as globs over "{server}__{tool}"
        "mcp_servers": lambda v: _globs(v, "mcp_servers", allow_empty=True),
        "mcp_tools": lambda v: _globs(v, "mcp_tools"),
        # docs/spec.md §26, §30: none unless listed
        "passthrough": lambda v: _paths(v, "passthrough"),
        "agents": lambda v: _globs(v, "agents", allow_empty=True),
    }
    for field, check in checks.items():
        if field in body:
            out[field] = check(body[field])
    if not partial:
        out.setdefault("models", ["*"])
        out.setdefault("budget_period", "month")
        out.setdefault("metadata", {})
    return out


def tenant_fields(body: dict[str, Any], partial: bool) -> dict[str, Any]:
    _unknown(body, TENANT_FIELDS - ({"name"} if partial else set()))
    out: dict[str, Any] = {}
    if not partial:
        out["name"] = name(body.get("name"))
    for field in ("mcp_servers", "mcp_tools", "agents"):
        if field in body:
            out[field] = _globs(body[field], field, allow_none=True)
    if "passthrough" in body:
        out["passthrough"] = _paths(body["passthrough"], "passthrough")
    if "budget_usd" in body:
        out["budget_usd"] = _usd(body["budget_usd"])
    if "budget_period" in body:
        out["budget_period"] = _period(body["budget_period"])
    if "metadata" in body:
        out["metadata"] = _metadata(body["metadata"])
    if not partial:
        out.setdefault("budget_period", "month")
    return out


__all__ = [
    "KEY_ID_RE",
    "NAME_RE",
    "PERIODS",
    "AdminConflict",
    "StoreUnavailable",
    "expires",
    "grace",
    "key_fields",
    "name",
    "parse_object",
    "tenant_fields",
]
