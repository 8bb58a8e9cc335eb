"""The key store as the process keeps it (docs/spec.md §28): the durable store, the
in-memory index, and the loop that keeps the index current.

The loop waits for a change to be announced (Redis pub/sub) or for :attr:`poll_s` to pass,
then reads the store's counter; when it moved past what the index has seen, it reads what
changed since and applies it (newer versions only). So a replica that missed a message
catches up on its next poll, and a change is in force everywhere within ``poll_s`` plus a
read. A write made here is applied to the index at once. With the store unreachable the
index keeps serving what it holds and :meth:`KeyService.state` says so (``/readyz``:
``degraded``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

from gateway.config import Config
from gateway.keys.index import KeyIndex
from gateway.keys.records import Record, RecordStore, StoreDown
from gateway.keys.redis import RedisKeyStore
from gateway.keys.sqlite import SqliteStore
from gateway.store.connect import shared_redis

log = logging.getLogger("gateway.keys")

#: each command of the key store's Redis waits at most this (none is on the request path)
STORE_TIMEOUT_S = 1.0


def store_enabled(config: Config) -> bool:
    """Whether the key store and the admin API run: auth on, and an admin key or an admin
    JWT grant to make keys with."""
    admin_jwt = any(j.admin_groups for j in config.auth.jwt)
    return config.auth.mode == "keys" and config.admin.enabled(admin_jwt)


class KeyService:
    def __init__(self, store: RecordStore, poll_s: float = 0.5) -> None:
        self.store = store
        self.poll_s = poll_s
        self.index = KeyIndex()
        #: why the last read of the store failed (None: it answered)
        self.failure: str | None = "not read yet"
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.store.name

    def state(self) -> str:
        return "ok" if self.failure is None else f"unreachable ({self.failure})"

    async def sync(self) -> bool:
        """Bring the index up to the store's counter; False when the store did not answer."""
        try:
            version, epoch = await self.store.head()
            self._check_epoch(version, epoch)
            while version > self.index.seen:
                changed = await self.store.changes(self.index.seen)
                for record in changed:
                    self.index.apply(record, read=True)
                if not changed:  # the counter moved, the record is not readable yet
                    break
                version = await self.store.version()
        except StoreDown as exc:
            if self.failure is None:
                log.warning(
                    "key store (%s) unreachable: serving the keys known (%s)", self.name, exc
                )
            self.failure = str(exc) or type(exc).__name__
            return False
        if self.failure is not None and self.failure != "not read yet":
            log.warning("key store (%s) is back", self.name)
        self.failure = None
        return True

    def _check_epoch(self, version: int, epoch: str) -> None:
        """Forget the index when the store is not the one it was read from: another epoch, or
        a counter gone back (a Redis restarted without its data)."""
        held = bool(self.index.records) or self.index.seen > 0
        if held and (epoch != self.index.epoch or version < self.index.seen):
            log.error(
                "key store (%s): its data was lost (a Redis restarted without it? run it with "
                "appendonly yes): reading it again from the start",
                self.name,
            )
            self.index.reset()
        self.index.epoch = epoch

    async def start(self) -> None:
        """Read the store once (a dead store does not stop a start), then keep following it."""
        await self.sync()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            try:
                await self.store.wait(self.poll_s)
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the loop die: the next beat retries
                log.exception("key store: sync failed")
                await asyncio.sleep(self.poll_s)

    async def write(self, record: Record, expected: int) -> Record:
        """Write through the store (raises :class:`~gateway.keys.records.Conflict`,
        :class:`~gateway.keys.records.StoreDown`) and apply it here at once."""
        record = {**record, "updated_at": time.time()}
        written = await self.store.write(record, expected)
        self.index.apply(written)
        return written

    async def fresh(self, name: str) -> Record | None:
        """The record as the store holds it now (what a change starts from), tombstones
        included; applied to the index when newer."""
        record = await self.store.get(name)
        if record is not None:
            self.index.apply(record)
        return record

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.store.aclose()


def build_key_service(config: Config, environ: Mapping[str, str]) -> KeyService | None:
    """The key service of a config (None: no key store): Redis when the gateway shares one
    (``[admin] store = "auto"`` or ``"redis"``), else the SQLite file in the data directory."""
    if not store_enabled(config):
        return None
    admin = config.admin
    redis = shared_redis(config, environ) if admin.store in ("auto", "redis") else None
    store: RecordStore
    if redis is not None:
        store = RedisKeyStore(
            redis.url, STORE_TIMEOUT_S, password=redis.password, cluster=redis.cluster
        )
    else:
        store = SqliteStore(admin.directory(dict(environ)))
    return KeyService(store, admin.poll_s)


__all__ = ["STORE_TIMEOUT_S", "KeyService", "build_key_service", "store_enabled"]
