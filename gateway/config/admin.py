"""``[admin]``: the key store and the admin API (docs/spec.md §28)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway.config.key_paths import KeyPathErrors


@dataclass(frozen=True, slots=True)
class AdminConfig:
    #: the environment variable holding the admin key (``Authorization: Bearer`` on
    #: ``/admin/v1/``); unset, only JWTs of an ``admin_groups`` grant are admins
    key_env: str | None = None
    #: a listener of its own for the admin API (``host:port``, ``[::1]:9090``): there only the
    #: admin API and ``/healthz``, ``/readyz`` are served, and the admin API is no longer served
    #: on the gateway's port (docs/spec.md §28)
    listen: str | None = None
    #: where the key store's SQLite file lives when no Redis is shared (None: the per-user
    #: data directory, ``$XDG_DATA_HOME/llm-gateway`` or ``~/.local/share/llm-gateway``)
    data_dir: str | None = None
    #: "auto": Redis when the gateway shares one (``auth.redis_url`` or a Redis ``[cache]``),
    #: else SQLite; "off": no key store and no admin API
    store: Literal["auto", "redis", "sqlite", "off"] = "auto"
    #: the catch-up poll of the store's version counter (pub/sub pushes changes sooner)
    poll_s: float = 0.5
    #: the largest admin request body
    max_body_bytes: int = 65536

    def enabled(self, has_admin_jwt: bool) -> bool:
        """Whether the key store and the admin API run: an admin key or an admin JWT grant."""
        return self.store != "off" and (bool(self.key_env) or has_admin_jwt)

    def address(self) -> tuple[str, int] | None:
        """``listen`` as (host, port) — the host without an IPv6 address's brackets — or None
        when unset or not of that form (:func:`check_admin` says why)."""
        if self.listen is None:
            return None
        host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            return None
        bracketed = host.startswith("[") and host.endswith("]")
        host = host[1:-1] if bracketed else host
        if not host or (":" in host) != bracketed or any(c in host for c in "[]/ "):
            return None
        return host, int(port)

    def directory(self, environ: dict[str, str] | None = None) -> Path:
        env = os.environ if environ is None else environ
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "llm-gateway"


def check_admin(a: AdminConfig, err: KeyPathErrors, *, port: int, on: bool) -> None:
    """``[admin]``; ``port`` is ``[server] port``, ``on`` whether the admin API runs."""
    if a.listen is not None:
        _check_listen(a, err, port, on)
    if a.key_env is not None and not a.key_env:
        err("admin.key_env", "must name an environment variable")
    err.positive(a, "admin", "poll_s", "max_body_bytes")
    if not 0.05 <= a.poll_s <= 0.9:
        err("admin.poll_s", "must be within 0.05..0.9 (a change is in force within 1 s)")


def _check_listen(a: AdminConfig, err: KeyPathErrors, port: int, on: bool) -> None:
    address = a.address()
    if address is None:
        err(
            "admin.listen",
            f'must be "host:port" (port 1..65535; an IPv6 address in brackets, '
            f'"[::1]:9090"), got {a.listen!r}',
        )
    elif address[1] == port:
        err("admin.listen", f"must not be the gateway's own port ([server] port = {port})")
    if not on:
        err(
            "admin.listen",
            'the admin API is off: it needs [auth] mode = "keys" with [admin] key_env or an '
            '[[auth.jwt]] admin_groups grant (and [admin] store not "off")',
        )


__all__ = ["AdminConfig", "check_admin"]
