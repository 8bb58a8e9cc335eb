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

DEFAULT_URL = "http://127.0.0.1:8080"
KEY_ENV = "GATEWAY_ADMIN_KEY"
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


def budget(text: str) -> tuple[float, str]:
    """``10/month`` → (10.0, "month"); a bare number is per month."""
    amount, _, period = text.partition("/")
    try:
        usd = float(amount.lstrip("$"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a budget: {text!r} (e.g. 10/month)") from None
    period = period or "month"
    if period not in ("day", "week", "month", "total"):
        raise argparse.ArgumentTypeError("the period is day, week, month or total")
    return usd, period


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("GATEWAY_URL", DEFAULT_URL),
        help="the gateway [%(default)s]",
    )
    p.add_argument(
        "--admin-key-env", default=KEY_ENV, metavar="VAR", help="holds the admin key [%(default)s]"
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON")


def _policy(p: argparse.ArgumentParser, key: bool) -> None:
    p.add_argument("--budget", type=budget, help="USD per period: 10/month, 5/day, 100/total")
    if key:
        p.add_argument("--models", nargs="+", help="model globs, e.g. 'gpt-4o*' [*]")
        p.add_argument("--rpm", type=int)
        p.add_argument("--tpm", type=int)
        p.add_argument("--expires", help="RFC 3339 time, e.g. 2030-01-01T00:00:00Z")
    p.add_argument("--meta", nargs="+", default=[], metavar="K=V", help="metadata entries")


def add_parsers(sub: Any) -> None:
    keys = sub.add_parser("keys", help="API keys of the key store (docs/spec.md §28)")
    ks = keys.add_subparsers(dest="action", required=True)
    create = ks.add_parser("create", help="make a key: its secret is printed once")
    create.add_argument("--tenant", required=True)
    _policy(create, key=True)
    ks.add_parser("list", help="every key")
    for action, what in (
        ("get", "a key and its spend"),
        ("revoke", "delete a key"),
        ("block", "refuse a key until unblocked"),
        ("unblock", "serve a blocked key again"),
    ):
        ks.add_parser(action, help=what).add_argument("id")
    rotate = ks.add_parser("rotate", help="a new secret (printed once)")
    rotate.add_argument("id")
    rotate.add_argument("--grace", type=float, default=0.0, help="seconds the old one still works")
    update = ks.add_parser("update", help="change a key's policy")
    update.add_argument("id")
    _policy(update, key=True)
    tenants = sub.add_parser("tenants", help="tenants of the key store (docs/spec.md §28)")
    ts = tenants.add_subparsers(dest="action", required=True)
    ts.add_parser("list", help="every tenant")
    for action in ("create", "update"):
        t = ts.add_parser(action, help=f"{action} a tenant")
        t.add_argument("name")
        _policy(t, key=False)
    ts.add_parser("get", help="a tenant and its spend").add_argument("name")
    ts.add_parser("delete", help="delete a tenant").add_argument("name")
    for p in (*ks.choices.values(), *ts.choices.values()):
        _common(p)


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


__all__ = ["AdminClient", "AdminFailed", "add_parsers", "budget", "run"]
