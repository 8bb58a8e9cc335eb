"""``gateway keys …`` and ``gateway tenants …``: the admin API (docs/spec.md §28) from the
command line. The admin key is read from an environment variable (``--admin-key-env``, default
``GATEWAY_ADMIN_KEY``), never from an argument (a process list shows arguments)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import quote

import httpx2
import orjson

from gateway.keys.records import CONFIG_KEY_ID_RE, KEY_ID_RE, NAME_RE

EXIT_FAILED = 1
EXIT_USAGE = 2


class AdminClient:
    """The admin API over HTTP: each call answers its JSON or raises :class:`AdminFailed`."""

    def __init__(self, url: str, key: str, timeout: float = 10.0) -> None:
        self.base = url.rstrip("/") + "/admin/v1/"
        self._headers = {"authorization": f"Bearer {key}"}
        self.timeout = timeout

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        with httpx2.Client(timeout=self.timeout) as client:
            answer = client.request(method, self.base + path, json=body, headers=self._headers)
        try:
            data = answer.json()
        except ValueError:
            data = {"error": {"message": answer.text[:200]}}
        if answer.status_code >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            message = (error or {}).get("message") or f"HTTP {answer.status_code}"
            raise AdminFailed(f"{answer.status_code}: {message}")
        return data


class AdminFailed(Exception):
    pass


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.budget is not None:
        body["budget_usd"], body["budget_period"] = args.budget
    for name, field in (("models", "models"), ("rpm", "rpm"), ("tpm", "tpm")):
        if getattr(args, name, None) is not None:
            body[field] = getattr(args, name)
    if getattr(args, "expires", None):
        body["expires_at"] = args.expires
    if args.meta:
        body["metadata"] = dict(m.partition("=")[::2] for m in args.meta)
    return body


class BadName(Exception):
    """An id or a name the server would not take: never put into a URL."""


def _checked(kind: str, value: str | None) -> str:
    """``value`` checked against the server's patterns (docs/spec.md §28), quoted for a URL
    path segment (so ``../tenants/acme`` is never a path)."""
    if value is None:
        return ""
    if kind == "keys":
        ok = KEY_ID_RE.fullmatch(value) or CONFIG_KEY_ID_RE.fullmatch(value)
        what = "a key id is key_ and 16 hex digits (or config_ and 12)"
    else:
        ok = NAME_RE.fullmatch(value)
        what = "a tenant's name is 1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit"
    if not ok:
        raise BadName(f"not an id: {value[:80]!r} ({what})")
    return quote(value, safe="")


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    kind, action = args.command, args.action
    name = getattr(args, "id", None) or getattr(args, "name", None)
    if action == "create" and kind == "tenants":
        _checked(kind, name)
    elif action not in ("list", "create"):
        name = _checked(kind, name)
    if action == "list":
        return "GET", kind, None
    if action == "create":
        body = _fields(args)
        body.update({"tenant": args.tenant} if kind == "keys" else {"name": name})
        return "POST", kind, body
    if action == "update":
        return "PATCH", f"{kind}/{name}", _fields(args)
    if action in ("revoke", "delete"):
        return "DELETE", f"{kind}/{name}", None
    if action == "rotate":
        return "POST", f"keys/{name}/rotate", {"grace_s": args.grace}
    if action in ("block", "unblock"):
        return "POST", f"keys/{name}/{action}", None
    return "GET", f"{kind}/{name}", None


def _show(data: Any) -> str:
    if not isinstance(data, dict):
        return str(data)
    if data.get("object") == "list":
        rows = [_line(item) for item in data.get("data", [])]
        return "\n".join(rows) if rows else "(none)"
    text = _line(data)
    if data.get("key"):
        text += f"\nkey: {data['key']}\n(the secret is shown this once: keep it now)"
    return text


def _line(item: dict[str, Any]) -> str:
    name = item.get("id") or item.get("name")
    shown = [f"{name}", f"tenant={item['tenant']}" if "tenant" in item else ""]
    for field in ("prefix", "models", "budget_usd", "budget_period", "rpm", "tpm", "managed_by"):
        if item.get(field) is not None:
            shown.append(f"{field}={item[field]}")
    if item.get("blocked"):
        shown.append("BLOCKED")
    if item.get("deleted"):
        shown.append("deleted")
    return "  ".join(s for s in shown if s)


def run(args: argparse.Namespace) -> int:
    key = os.environ.get(args.admin_key_env)
    if not key:
        print(f"set {args.admin_key_env} to the gateway's admin key", file=sys.stderr)
        return EXIT_USAGE
    try:
        method, path, body = _request(args)
    except BadName as exc:
        print(f"gateway {args.command} {args.action}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        data = AdminClient(args.url, key).call(method, path, body)
    except (AdminFailed, httpx2.HTTPError) as exc:
        print(f"gateway {args.command} {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() if args.json else _show(data))
    return 0


__all__ = ["AdminClient", "AdminFailed", "run"]
