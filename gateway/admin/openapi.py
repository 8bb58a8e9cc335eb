"""``GET /admin/v1/openapi.json``: the admin API described (OpenAPI 3.1, docs/spec.md §28)."""

from __future__ import annotations

from typing import Any, Final


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    return schema


_GLOBS: Final = {"type": "array", "items": {"type": "string"}, "maxItems": 64}
_COUNT: Final = {"type": ["integer", "null"], "minimum": 1}
_USD: Final = {"type": ["number", "null"], "exclusiveMinimum": 0}
_PERIOD: Final = {"enum": ["day", "week", "month", "total"]}
_KEY_IN: Final = _obj(
    {
        "tenant": {"type": "string"},
        "models": _GLOBS,
        "budget_usd": _USD,
        "budget_period": _PERIOD,
        "rpm": _COUNT,
        "tpm": _COUNT,
        "expires_at": {"type": ["string", "number", "null"], "description": "RFC 3339 or Unix s"},
        "metadata": {"type": "object", "description": "at most 4096 bytes of JSON"},
        "mcp_servers": _GLOBS,
        "mcp_tools": _GLOBS,
        "passthrough": _GLOBS,
        "agents": _GLOBS,
    },
    ("tenant",),
)
_TENANT_IN: Final = _obj(
    {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
        "budget_usd": _USD,
        "budget_period": _PERIOD,
        "mcp_servers": _GLOBS,
        "mcp_tools": _GLOBS,
        "passthrough": _GLOBS,
        "agents": _GLOBS,
        "metadata": {"type": "object"},
    },
    ("name",),
)
_ERROR: Final = {"description": "an error in the OpenAI shape: {error: {message, type, code}}"}


def _op(summary: str, body: dict[str, Any] | None = None, ok: str = "200") -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {ok: {"description": "JSON"}, "4XX": _ERROR, "503": _ERROR},
    }
    if body is not None:
        op["requestBody"] = {"content": {"application/json": {"schema": body}}}
    return op


_GRACE: Final = _obj({"grace_s": {"type": "number", "minimum": 0}})
OPENAPI: Final[dict[str, Any]] = {
    "openapi": "3.1.0",
    "info": {"title": "llm-gateway admin API", "version": "1"},
    "components": {
        "securitySchemes": {"admin": {"type": "http", "scheme": "bearer"}},
        "schemas": {"KeyIn": _KEY_IN, "TenantIn": _TENANT_IN},
    },
    "security": [{"admin": []}],
    "paths": {
        "/admin/v1/keys": {
            "get": _op("every key (the config's: managed_by config)"),
            "post": _op("make a key: its secret is answered once, as key", _KEY_IN, "201"),
        },
        "/admin/v1/keys/{id}": {
            "get": _op("a key and its spend"),
            "patch": _op("change a key's fields", _KEY_IN),
            "delete": _op("delete a key"),
        },
        "/admin/v1/keys/{id}/block": {"post": _op("refuse the key until unblocked")},
        "/admin/v1/keys/{id}/unblock": {"post": _op("serve the key again")},
        "/admin/v1/keys/{id}/rotate": {
            "post": _op("a new secret; the old one works grace_s more seconds", _GRACE)
        },
        "/admin/v1/tenants": {
            "get": _op("every tenant"),
            "post": _op("make a tenant", _TENANT_IN, "201"),
        },
        "/admin/v1/tenants/{name}": {
            "get": _op("a tenant and its spend"),
            "patch": _op("change a tenant", _TENANT_IN),
            "delete": _op("delete a tenant"),
        },
        "/admin/v1/spend": {"get": _op("every budget: spent, reserved, remaining")},
        "/_gateway/api/me": {"get": _op("the calling key: models, limits, budgets, spend")},
    },
}

__all__ = ["OPENAPI"]
