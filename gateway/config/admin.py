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
    #: a listener of its own for the admin API: not built (docs/spec.md §28); set, the config
    #: is refused rather than the API served where it was not meant to be
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

    def directory(self, environ: dict[str, str] | None = None) -> Path:
        env = os.environ if environ is None else environ
        if self.data_dir:
            return Path(self.data_dir).expanduser()
        base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        return Path(base) / "llm-gateway"


def check_admin(a: AdminConfig, err: KeyPathErrors) -> None:
    if a.listen is not None:
        err(
            "admin.listen",
            "a listener of its own for the admin API is not built yet: leave it unset (the "
            "admin API is served on the gateway's listener, docs/spec.md §28)",
        )
    if a.key_env is not None and not a.key_env:
        err("admin.key_env", "must name an environment variable")
    err.positive(a, "admin", "poll_s", "max_body_bytes")
    if not 0.05 <= a.poll_s <= 0.9:
        err("admin.poll_s", "must be within 0.05..0.9 (a change is in force within 1 s)")


__all__ = ["AdminConfig", "check_admin"]
