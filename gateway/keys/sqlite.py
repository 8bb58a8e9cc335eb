"""The key store in a SQLite file (stdlib :mod:`sqlite3`): the embedded default's, so keys an
admin made survive a restart (docs/spec.md §28).

One table of records (name, version, JSON) and one row holding the counter; a write is one
``BEGIN IMMEDIATE`` transaction that checks the version it read, bumps the counter and stores
the record under it. Every call runs in a thread (the file is on disk). The processes sharing
the file (the workers of one ``gateway serve``) learn of each other's writes by polling the
counter (:meth:`SqliteStore.wait` only sleeps).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import orjson

from gateway.keys.records import Conflict, Record, StoreDown, field_of

FILE_NAME = "keys.sqlite3"

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    name TEXT PRIMARY KEY, version INTEGER NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS records_version ON records (version);
CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER);
INSERT OR IGNORE INTO counter VALUES (1, 0);
"""


class SqliteStore:
    name = "sqlite"

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._failed: str | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            db = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False)
            db.isolation_level = None  # transactions by hand
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            self.path.chmod(0o600)
            self._db = db
        return self._db

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                return fn(self._conn())

        try:
            result = await asyncio.to_thread(call)
        except (sqlite3.Error, OSError) as exc:
            self._failed = type(exc).__name__
            raise StoreDown(f"key store {self.path.name}: {exc}") from exc
        self._failed = None
        return result

    async def version(self) -> int:
        row = await self._run(lambda db: db.execute("SELECT version FROM counter").fetchone())
        return int(row[0])

    async def head(self) -> tuple[int, str]:
        """The file is the store: one epoch (a lost file is a counter gone back to 0)."""
        return await self.version(), "sqlite"

    async def changes(self, since: int) -> list[Record]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT version, body FROM records WHERE version > ? ORDER BY version", (since,)
            ).fetchall()
        )
        return [{**orjson.loads(body), "version": int(v)} for v, body in rows]

    async def get(self, name: str) -> Record | None:
        row = await self._run(
            lambda db: db.execute(
                "SELECT version, body FROM records WHERE name = ?", (name,)
            ).fetchone()
        )
        return None if row is None else {**orjson.loads(row[1]), "version": int(row[0])}

    async def write(self, record: Record, expected: int) -> Record:
        name = field_of(record)
        body = orjson.dumps({k: v for k, v in record.items() if k != "version"}).decode()

        def write(db: sqlite3.Connection) -> int | None:
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT version FROM records WHERE name = ?", (name,)).fetchone()
                if (row[0] if row else 0) != expected:
                    db.execute("ROLLBACK")
                    return None
                db.execute("UPDATE counter SET version = version + 1")
                (version,) = db.execute("SELECT version FROM counter").fetchone()
                db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?)", (name, version, body))
                db.execute("COMMIT")
                return int(version)
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

        version = await self._run(write)
        if version is None:
            raise Conflict(name)
        return {**record, "version": version}

    async def wait(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)

    def state(self) -> str:
        return "ok" if self._failed is None else f"down ({self._failed})"

    async def aclose(self) -> None:
        def close() -> None:
            with self._lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None

        await asyncio.to_thread(close)


__all__ = ["FILE_NAME", "SqliteStore"]
