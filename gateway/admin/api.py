"""The admin API under ``/admin/v1/`` (docs/spec.md §28): keys and tenants of the key store,
their spend, the OpenAPI document; and ``GET /_gateway/api/me`` for a key holder.

Every answer is JSON, every error in the OpenAI shape. A change reads the record as the store
holds it now, changes it and writes it back with the version it read (a concurrent change makes
it read again), then writes an audit line. Keys and tenants of the config are listed as
``managed_by: "config"`` and cannot be changed here (409 ``managed_by_config``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from gateway.admin import payloads as p
from gateway.admin.access import AdminAccess, bearer_of
from gateway.admin.openapi import OPENAPI
from gateway.admin.views import (
    audit,
    config_key_id,
    config_key_view,
    config_tenant,
    config_tenant_view,
    key_view,
    tenant_view,
)
from gateway.config import Config
from gateway.context import RequestContext
from gateway.errors import ClientGone, GatewayError, MethodNotAllowed, NotFound
from gateway.hops.edge import read_body
from gateway.keys import Conflict, KeyService, StoreDown, new_secret, prefix_of, store_enabled
from gateway.keys.records import Record, digest_of, new_id
from gateway.runtime import Endpoint, Runtime
from gateway.scope import InternalError
from gateway.types import Receive, Scope, Send
from gateway.writer import ResponseWriter

log = logging.getLogger("gateway.admin")

PREFIX: Final = "/admin/v1/"
ME_PATH: Final = "/_gateway/api/me"
_RETRIES: Final = 3
#: old secrets a key keeps in their grace at once
_MAX_OLD: Final = 8
_NO_STORE: Final = (b"cache-control", b"no-store")

Handler = Callable[["AdminCall"], Awaitable[tuple[int, Any]]]


class AdminCall:
    """One admin request: who, what, the key service."""

    __slots__ = ("body", "keys", "method", "parts", "rt", "who")

    def __init__(self, rt: Runtime, keys: KeyService, method: str, parts: list[str]) -> None:
        self.rt, self.keys, self.method, self.parts = rt, keys, method, parts
        self.who = ""
        self.body: dict[str, Any] = {}


def _service(rt: Runtime) -> KeyService:
    keys = rt.services.keys if rt.services is not None else None
    if keys is None:
        raise NotFound("the admin API is not enabled: set [admin] key_env", code="admin_disabled")
    return keys


def _writer(rt: Runtime, scope: Scope, send: Send) -> tuple[RequestContext, ResponseWriter]:
    ctx = rt.edge.accept(scope)
    ctx.response_headers = [_NO_STORE]
    return ctx, ResponseWriter(ctx, send, None)


class AdminApi:
    """The endpoints of one config's admin API."""

    def __init__(self, config: Config, environ: Mapping[str, str]) -> None:
        self.config = config
        self.access = AdminAccess(config, environ)
        self.max_body = config.admin.max_body_bytes

    def endpoints(self) -> dict[str, Endpoint]:
        return {PREFIX: self.serve, ME_PATH: self.me}

    async def serve(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        ctx, out = _writer(rt, scope, send)
        try:
            await self._serve(rt, scope, receive, ctx, out)
        except ClientGone:
            ctx.disconnected = True
        except Exception:  # a bug: a 500 in the OpenAI shape, never a bare traceback
            log.exception("admin request %s failed", ctx.request_id)
            if not out.started:
                await out.error(InternalError("internal error in the gateway"))

    async def _serve(
        self, rt: Runtime, scope: Scope, receive: Receive, ctx: RequestContext, out: ResponseWriter
    ) -> None:
        try:
            parts = scope["path"][len(PREFIX) :].split("/")
            method = scope["method"]
            if parts == ["openapi.json"] and method == "GET":
                await out.json(200, OPENAPI)
                return
            call = AdminCall(rt, _service(rt), method, parts)
            call.who = self.access.who(rt, bearer_of(scope["headers"]))
            handler = _route(call)
            if method in ("POST", "PATCH"):
                call.body = p.parse_object(await read_body(ctx, receive, self.max_body))
            status, answer = await handler(call)
        except GatewayError as exc:
            await out.error(exc)
            return
        except StoreDown as exc:
            await out.error(p.StoreUnavailable(str(exc), code="key_store_unavailable"))
            return
        await out.json(status, answer)

    async def me(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /_gateway/api/me``: the caller's key — its models, limits, budgets, spend."""
        ctx, out = _writer(rt, scope, send)
        try:
            if scope["method"] != "GET":
                raise MethodNotAllowed("GET only", allow="GET", code="method_not_allowed")
            entry = rt.auth.identify(ctx.credential)
            answer = await _me(rt, entry)
        except GatewayError as exc:
            await out.error(exc)
            return
        await out.json(200, answer)


def _route(call: AdminCall) -> Handler:
    parts, method = call.parts, call.method
    kind = parts[0] if parts else ""
    table: dict[tuple[str, int], dict[str, Handler]] = {
        ("keys", 1): {"GET": list_keys, "POST": create_key},
        ("keys", 2): {"GET": get_key, "PATCH": update_key, "DELETE": delete_key},
        ("keys", 3): {"POST": key_action},
        ("tenants", 1): {"GET": list_tenants, "POST": create_tenant},
        ("tenants", 2): {"GET": get_tenant, "PATCH": update_tenant, "DELETE": delete_tenant},
        ("spend", 1): {"GET": spend},
    }
    handlers = table.get((kind, len(parts)))
    if handlers is None or (len(parts) > 1 and not parts[1]):
        raise NotFound(f"no admin endpoint {PREFIX}{'/'.join(parts)[:100]}", code="not_found")
    handler = handlers.get(method)
    if handler is None:
        allow = ", ".join(handlers)
        raise MethodNotAllowed(
            f"{method} is not allowed here", allow=allow, code="method_not_allowed"
        )
    return handler


# ------------------------------------------------------------------ keys


def _key_id(call: AdminCall) -> str:
    key_id = call.parts[1]
    if p.KEY_ID_RE.fullmatch(key_id) or key_id.startswith("config_"):
        return key_id
    raise NotFound("no such key", code="key_not_found")


def _config_key(call: AdminCall, key_id: str) -> dict[str, Any]:
    for k in call.rt.config.auth.keys:
        if config_key_id(k) == key_id:
            return config_key_view(k)
    raise NotFound(f"no key {key_id!r}", code="key_not_found")


def _managed(what: str) -> p.AdminConflict:
    return p.AdminConflict(
        f"{what} is managed by the config file: change it there", code="managed_by_config"
    )


async def list_keys(call: AdminCall) -> tuple[int, Any]:
    stored = [key_view(r) for r in call.keys.index.key_records()]
    configured = [config_key_view(k) for k in call.rt.config.auth.keys]
    stored.sort(key=lambda v: v.get("created_at") or "")
    return 200, {"object": "list", "data": configured + stored}


async def create_key(call: AdminCall) -> tuple[int, Any]:
    fields = p.key_fields(call.body, partial=False)
    held = await call.keys.fresh("t:" + fields["tenant"])
    if held is not None and held.get("deleted"):  # its keys are refused: make none
        raise p.AdminConflict(
            f"tenant {fields['tenant']!r} was deleted: create it again first",
            code="tenant_deleted",
        )
    secret = new_secret()
    now = time.time()
    record: Record = {"kind": "key", "id": new_id(), **fields}
    record.update(digest=digest_of(secret), prefix=prefix_of(secret), old=[], blocked=False)
    record["created_at"] = now
    key_view({**record, "updated_at": now})  # what the answer and audit line show: before writing
    written = await call.keys.write(record, 0)
    view = key_view(written)
    audit(call.who, "key.create", written["id"], None, view)
    return 201, {**view, "key": secret}


async def _key_record(call: AdminCall, key_id: str) -> Record:
    if key_id.startswith("config_"):
        _config_key(call, key_id)  # 404 when there is none
        raise _managed(f"key {key_id}")
    record = await call.keys.fresh("k:" + key_id)
    if record is None or record.get("deleted"):
        raise NotFound(f"no key {key_id!r}", code="key_not_found")
    return record


async def get_key(call: AdminCall) -> tuple[int, Any]:
    key_id = _key_id(call)
    if key_id.startswith("config_"):
        return 200, _config_key(call, key_id)
    record = await _key_record(call, key_id)
    return 200, {**key_view(record), "spend": await _key_spend(call.rt, record)}


async def _change_key(
    call: AdminCall, action: str, change: Callable[[Record], Record]
) -> tuple[Record, Record]:
    """Read, change, write back with the version read (again on a concurrent change)."""
    key_id = _key_id(call)
    for _ in range(_RETRIES):
        before = await _key_record(call, key_id)
        changed = change(dict(before))
        if not changed.get("deleted"):
            key_view(changed)  # what the answer and audit line show: before writing
        try:
            after = await call.keys.write(changed, int(before["version"]))
        except Conflict:
            continue
        shown = None if after.get("deleted") else key_view(after)
        audit(call.who, action, key_id, key_view(before), shown)
        return before, after
    raise p.AdminConflict("the key changed meanwhile: try again", code="concurrent_change")


async def update_key(call: AdminCall) -> tuple[int, Any]:
    fields = p.key_fields(call.body, partial=True)
    _, after = await _change_key(call, "key.update", lambda r: {**r, **fields})
    return 200, key_view(after)


async def delete_key(call: AdminCall) -> tuple[int, Any]:
    key_id = _key_id(call)

    def tombstone(r: Record) -> Record:
        return {"kind": "key", "id": r["id"], "tenant": r["tenant"], "deleted": True}

    await _change_key(call, "key.delete", tombstone)
    return 200, {"id": key_id, "object": "gateway.key", "deleted": True}


async def key_action(call: AdminCall) -> tuple[int, Any]:
    action = call.parts[2]
    if action in ("block", "unblock"):
        blocked = action == "block"
        _, after = await _change_key(call, f"key.{action}", lambda r: {**r, "blocked": blocked})
        return 200, key_view(after)
    if action == "rotate":
        return await _rotate(call)
    raise NotFound(f"no key action {action[:40]!r}", code="not_found")


async def _rotate(call: AdminCall) -> tuple[int, Any]:
    grace_s = p.grace(call.body)
    secret = new_secret()

    def rotate(r: Record) -> Record:
        now = time.time()
        old = [(d, until) for d, until in r.get("old", ()) if until > now]
        if grace_s > 0:
            old.append((r["digest"], now + grace_s))
        old = old[-_MAX_OLD:]  # rotations within one grace: the newest few stay valid
        return {**r, "digest": digest_of(secret), "prefix": prefix_of(secret), "old": old}

    _, after = await _change_key(call, "key.rotate", rotate)
    return 200, {**key_view(after), "key": secret}


# ------------------------------------------------------------------ tenants


def _tenant_name(call: AdminCall) -> str:
    try:
        return p.name(call.parts[1])
    except GatewayError:
        raise NotFound("no such tenant", code="tenant_not_found") from None


async def list_tenants(call: AdminCall) -> tuple[int, Any]:
    configured = [config_tenant_view(t) for t in call.rt.config.auth.tenants]
    stored = [tenant_view(t) for t in call.keys.index.tenant_records()]
    return 200, {"object": "list", "data": configured + stored}


async def create_tenant(call: AdminCall) -> tuple[int, Any]:
    fields = p.tenant_fields(call.body, partial=False)
    if config_tenant(call.rt.config, fields["name"]) is not None:
        raise _managed(f"tenant {fields['name']!r}")
    held = await call.keys.fresh("t:" + fields["name"])
    if held is not None and not held.get("deleted"):
        raise p.AdminConflict(f"tenant {fields['name']!r} exists", code="tenant_exists")
    record: Record = {"kind": "tenant", **fields, "created_at": time.time()}
    written = await call.keys.write(record, int(held["version"]) if held else 0)
    audit(call.who, "tenant.create", fields["name"], None, tenant_view(written))
    return 201, tenant_view(written)


async def get_tenant(call: AdminCall) -> tuple[int, Any]:
    tenant = _tenant_name(call)
    configured = config_tenant(call.rt.config, tenant)
    if configured is not None:
        view = config_tenant_view(configured)
    else:
        record = await call.keys.fresh("t:" + tenant)
        if record is None or record.get("deleted"):
            raise NotFound(f"no tenant {tenant!r}", code="tenant_not_found")
        view = tenant_view(record)
    return 200, {**view, "spend": await _tenant_spend(call.rt, tenant)}


async def _change_tenant(call: AdminCall, action: str, fields: dict[str, Any] | None) -> Record:
    tenant = _tenant_name(call)
    if config_tenant(call.rt.config, tenant) is not None:
        raise _managed(f"tenant {tenant!r}")
    for _ in range(_RETRIES):
        before = await call.keys.fresh("t:" + tenant)
        if before is None or before.get("deleted"):
            raise NotFound(f"no tenant {tenant!r}", code="tenant_not_found")
        if fields is None:
            change: Record = {"kind": "tenant", "name": tenant, "deleted": True}
        else:
            change = {**before, **fields}
        try:
            after = await call.keys.write(change, int(before["version"]))
        except Conflict:
            continue
        shown = None if fields is None else tenant_view(after)
        audit(call.who, action, tenant, tenant_view(before), shown)
        return after
    raise p.AdminConflict("the tenant changed meanwhile: try again", code="concurrent_change")


async def update_tenant(call: AdminCall) -> tuple[int, Any]:
    fields = p.tenant_fields(call.body, partial=True)
    return 200, tenant_view(await _change_tenant(call, "tenant.update", fields))


async def delete_tenant(call: AdminCall) -> tuple[int, Any]:
    """Refused (409 ``tenant_in_use``) while a live key names the tenant: its keys would lose
    the tenant's budget and the narrowing of its grants."""
    tenant = _tenant_name(call)
    await call.keys.sync()  # what the other replicas made too
    in_use = [k["id"] for k in call.keys.index.key_records() if k["tenant"] == tenant]
    if in_use:
        raise p.AdminConflict(
            f"tenant {tenant!r} has {len(in_use)} key(s) (e.g. {in_use[0]}): delete them first",
            code="tenant_in_use",
        )
    await _change_tenant(call, "tenant.delete", None)
    return 200, {"name": call.parts[1], "object": "gateway.tenant", "deleted": True}


# ------------------------------------------------------------------ spend


async def spend(call: AdminCall) -> tuple[int, Any]:
    return 200, await call.rt.auth.spend()


async def _budget_rows(rt: Runtime, budgets: list[Any]) -> list[dict[str, Any]]:
    if not budgets:
        return []
    rows, _ = await rt.auth.limits.report(budgets)
    out = []
    for b, (_start, spent, reserved, _reset) in zip(budgets, rows, strict=True):
        out.append(
            {
                "budget": b.label,
                "period": b.period,
                "budget_usd": b.usd,
                "spent_usd": spent / 1e9,
                "reserved_usd": reserved / 1e9,
                "remaining_usd": max(b.limit - spent - reserved, 0) / 1e9,
            }
        )
    return out


async def _key_spend(rt: Runtime, record: Record) -> list[dict[str, Any]]:
    stored = rt.auth.stored
    if stored is None:
        return []
    entry = stored.entry(record)
    return await _budget_rows(rt, list(entry.allowance.budgets))


async def _tenant_spend(rt: Runtime, tenant: str) -> list[dict[str, Any]]:
    budget = rt.auth.tenant_budgets.get(tenant)
    if budget is None and rt.auth.stored is not None:
        budget = rt.auth.stored.tenant(tenant)
    return await _budget_rows(rt, [budget] if budget is not None else [])


async def _me(rt: Runtime, entry: Any) -> dict[str, Any]:
    return {
        "object": "gateway.me",
        "tenant": entry.tenant,
        "models": list(entry.globs),
        "rpm": entry.rpm,
        "tpm": entry.tpm,
        "admin": entry.admin,
        "budgets": await _budget_rows(rt, list(entry.allowance.budgets)),
    }


def admin_endpoints(
    config: Config, environ: Mapping[str, str] | None = None
) -> dict[str, Endpoint]:
    """The admin API's endpoints for a config with a key store; ``/_gateway/api/me`` alone for
    one with keys and no store; none with auth off."""
    env = os.environ if environ is None else environ
    if store_enabled(config):
        return AdminApi(config, env).endpoints()
    if config.auth.mode == "keys":  # a key holder's own view, with or without the store
        return {ME_PATH: AdminApi(config, env).me}
    return {}


__all__ = ["ME_PATH", "PREFIX", "AdminApi", "admin_endpoints"]
