"""What the key store keeps (docs/spec.md §28): records as JSON objects, one per key
(``k:<id>``) and per tenant (``t:<name>``), each with the version the store's counter gave it.

A key record holds the sha256 of its secret (``digest``, hex) and the secret's first characters
(``prefix``), never the secret: a secret is 32 random bytes, so its sha256 is as good as a slow
hash. A rotated key keeps its old digests in ``old`` with the time each stops working. A deleted
record stays as a tombstone (``deleted``), so an older copy of it is never taken for news.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

#: what every secret the store makes starts with (and what its prefix shows)
SECRET_PREFIX: Final = "sk-gw-"
#: characters of a secret shown after its creation
PREFIX_CHARS: Final = 14

Record = dict[str, Any]

#: a tenant's name: what the config's tenants may be named too, without path tricks
NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: a key's id as the store makes it (:func:`new_id`)
KEY_ID_RE: Final = re.compile(r"key_[0-9a-f]{16}")
#: the id the admin API shows a key of the config by (``config_`` and its digest's first 12)
CONFIG_KEY_ID_RE: Final = re.compile(r"config_[0-9a-f]{12}")


class StoreDown(Exception):
    """The store could not answer (Redis unreachable, the SQLite file unreadable)."""


class Conflict(Exception):
    """The record changed since it was read (a concurrent write): read it again."""


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_id() -> str:
    return "key_" + secrets.token_hex(8)


def digest_of(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def prefix_of(secret: str) -> str:
    return secret[:PREFIX_CHARS]


def field_of(record: Record) -> str:
    """The record's name in the store: ``k:<id>`` or ``t:<name>``."""
    return ("k:" + str(record["id"])) if record["kind"] == "key" else ("t:" + str(record["name"]))


@dataclass(frozen=True, slots=True)
class OwnGrants:
    """What a key of the store may use besides models (docs/spec.md §28): each a list of glob
    lists, every one of which must match (the key's, then its tenant's when set)."""

    #: MCP servers and tools (``{server}__{tool}``; docs/spec.md §23)
    mcp_servers: list[Sequence[str]]
    mcp_tools: list[Sequence[str]]
    #: unmodelled paths (docs/spec.md §26)
    passthrough: list[Sequence[str]]
    #: A2A agents (docs/spec.md §30)
    agents: list[Sequence[str]]


class RecordStore(Protocol):
    """The durable side of the key store; every method raises :class:`StoreDown` when it
    cannot answer."""

    name: str

    async def version(self) -> int:
        """The counter: the version of the latest write."""
        ...

    async def head(self) -> tuple[int, str]:
        """The counter and the store's epoch: a random mark made with the store (set if
        missing), so a store that lost its data and was written again is told apart from the
        one read before, whatever its counter says."""
        ...

    async def changes(self, since: int) -> list[Record]:
        """Every record (tombstones included) written after version ``since``."""
        ...

    async def get(self, name: str) -> Record | None: ...

    async def write(self, record: Record, expected: int) -> Record:
        """Store ``record`` (without ``version``) if the stored one still has version
        ``expected`` (0: none stored); the record as written, with its new version. Raises
        :class:`Conflict` otherwise."""
        ...

    async def wait(self, timeout_s: float) -> None:
        """Return when a change was announced, or after ``timeout_s``."""
        ...

    def state(self) -> str: ...

    async def aclose(self) -> None: ...


__all__ = [
    "CONFIG_KEY_ID_RE",
    "KEY_ID_RE",
    "NAME_RE",
    "PREFIX_CHARS",
    "SECRET_PREFIX",
    "Conflict",
    "OwnGrants",
    "Record",
    "RecordStore",
    "StoreDown",
    "digest_of",
    "field_of",
    "new_id",
    "new_secret",
    "prefix_of",
]
