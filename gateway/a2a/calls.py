"""An A2A call read and checked before anything is sent (docs/spec.md §30)::

    body (413; JSON-RPC: a parse error or no request: 400) → method known (else -32601)
    → push-notification configs and the extended card refused (never forwarded)
    → the ids it names are the caller's tenant's (TaskNotFoundError) → rpm for a message (429)
    → the agent's interface for the binding and version → relayed (:mod:`gateway.a2a.relay`)

JSON-RPC (``POST /a2a/{agent}``) and HTTP+JSON (``/a2a/{agent}/…``) take the same checks; the
body that goes to the agent is the one the gateway parsed, written again (one reading).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson

from gateway.a2a import rest
from gateway.a2a.protocol import (
    EXTENDED_CARD_NOT_CONFIGURED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    METHODS,
    PUSH_NOT_SUPPORTED,
    Method,
    asks_push,
    named,
    parse_rpc,
    refusal,
)
from gateway.a2a.relay import AgentCall, relay
from gateway.hops.auth import Auth
from gateway.hops.edge import read_body

_JSON = ("content-type", "application/json")


async def admit(call: AgentCall, auth: Auth, method: Method, params: dict[str, Any]) -> None:
    """What the gateway refuses itself, the ids checked, a message counted against rpm."""
    rest_, rid = call.rest, call.rid
    if method.kind == "push" or (method.kind in ("send", "stream") and asks_push(params)):
        text = "push notifications are not relayed by this gateway: stream or poll the task"
        raise refusal(rest_, rid, PUSH_NOT_SUPPORTED, text, "refused")
    if method.kind == "card":
        text = "the extended agent card is not served through this gateway"
        raise refusal(rest_, rid, EXTENDED_CARD_NOT_CONFIGURED, text, "refused")
    try:
        ids = named(method, params)
    except ValueError as exc:
        raise refusal(rest_, rid, INVALID_PARAMS, str(exc), "rejected") from None
    await call.binder.check(ids, rest_, rid)
    if ids.task is not None:
        call.facts["task"] = ids.task
    if ids.context is not None:
        call.facts["context"] = ids.context
    if method.kind in ("send", "stream"):
        await auth.check(call.ctx)  # rpm counts messages (docs/spec.md §30)


async def jsonrpc(call: AgentCall, auth: Auth, headers: list[tuple[str, str]]) -> None:
    """``POST /a2a/{agent}``: one JSON-RPC request."""
    agent = call.agent
    body = await read_body(call.ctx, call.receive, agent.config.max_message_bytes)
    msg = parse_rpc(body)
    name, call.rid = msg["method"], msg["id"]
    call.facts["method"], call.facts["id"] = name, call.rid
    method = METHODS.get(name)
    if method is None:
        raise refusal(False, call.rid, METHOD_NOT_FOUND, f"method not found: {name}", "rejected")
    call.method = method
    params = msg.setdefault("params", {})
    await admit(call, auth, method, params)
    target = (await agent.card()).url("JSONRPC", method.version)
    if target is None:
        text = "the agent offers no JSON-RPC interface"
        raise refusal(False, call.rid, METHOD_NOT_FOUND, text, "rejected")
    url, tenant = target
    if tenant and "tenant" not in params:
        params["tenant"] = tenant  # the interface's (A2A §8.3.2)
    await relay(call, "POST", url, [*headers, _JSON], orjson.dumps(msg))


def _query(raw: bytes) -> dict[str, str]:
    """The query's parameters (one value each: the last), as the agent will get them."""
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))


async def http_json(call: AgentCall, auth: Auth, path: str, headers: list[tuple[str, str]]) -> None:
    """``/a2a/{agent}/{path}``: one HTTP+JSON operation (:mod:`gateway.a2a.rest`)."""
    ctx, agent = call.ctx, call.agent
    call.rest = True
    op = rest.parse(path, ctx.method)
    if op is None:
        text = f"no A2A operation is {ctx.method} {path}"
        raise refusal(True, None, METHOD_NOT_FOUND, text, "rejected")
    call.method, call.facts["method"] = op.method, op.name
    query = _query(ctx.query)
    if "id" in query or "taskId" in query:  # the path names the task, and only the path
        raise refusal(True, None, INVALID_PARAMS, "a task is named by the path", "rejected")
    body: bytes | None = None
    params: dict[str, Any] = dict(query)
    if ctx.method == "POST":
        raw = await read_body(ctx, call.receive, agent.config.max_message_bytes)
        try:
            parsed = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise refusal(True, None, INVALID_PARAMS, "the body must be a JSON object", "rejected")
        if op.task is not None and parsed.get("id", op.task) != op.task:
            raise refusal(True, None, INVALID_PARAMS, "the body names another task", "rejected")
        params = parsed
        body = orjson.dumps(parsed)
    if op.task is not None:
        params = {**params, "id": op.task}
    await admit(call, auth, op.method, params)
    target = (await agent.card()).url("HTTP+JSON", op.method.version)
    if target is None:
        text = "the agent offers no HTTP+JSON interface"
        raise refusal(True, None, METHOD_NOT_FOUND, text, "rejected")
    url = f"{target[0]}/{path}" + (f"?{urlencode(query)}" if query else "")
    sent = [*headers, _JSON] if body is not None else headers
    await relay(call, ctx.method, url, sent, body)


__all__ = ["admit", "http_json", "jsonrpc"]
