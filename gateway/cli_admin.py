"""The command line of ``gateway keys …`` and ``gateway tenants …`` (docs/spec.md §28): their
arguments only. What they do — the admin API over HTTP — is :mod:`gateway.client.admin`, loaded
when one of them runs: ``gateway serve`` builds this parser too and never imports the client
tools (docs/architecture.md)."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
KEY_ENV = "GATEWAY_ADMIN_KEY"


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


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``keys``/``tenants`` command (the client module is loaded now)."""
    from gateway.client import admin

    return admin.run(args)


__all__ = ["DEFAULT_URL", "KEY_ENV", "add_parsers", "budget", "run"]
