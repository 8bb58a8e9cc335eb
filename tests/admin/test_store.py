"""The key store's two stores and its index (docs/spec.md §28): a write names the version it
read (a concurrent one loses: Conflict), every write gets a newer version, a late or repeated
copy never undoes a newer record, a deleted record stays gone; the same for Redis and SQLite."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.keys import Conflict, KeyIndex
from gateway.keys.records import Record, RecordStore
from gateway.keys.redis import RedisKeyStore
from gateway.keys.sqlite import SqliteStore
from tests.redis_support import RedisServer


def key(version: int | None = None, **fields: object) -> Record:
    record: Record = {"kind": "key", "id": "key_0123456789abcdef", "tenant": "t"}
    record.update(digest="ab" * 32, prefix="sk-gw-x", old=[], **fields)
    if version is not None:
        record["version"] = version
    return record


def test_the_index_takes_newer_versions_only():
    index = KeyIndex()
    assert index.apply(key(2, blocked=True))
    assert not index.apply(key(1, blocked=False))  # a stale copy: ignored
    assert not index.apply(key(2, blocked=False))  # the same version again: ignored
    assert index.by_digest[bytes.fromhex("ab" * 32)][0]["blocked"] is True
    assert index.apply({"kind": "key", "id": "key_0123456789abcdef", "deleted": True, "version": 3})
    assert not index.by_digest and index.key_records() == []
    assert not index.apply(key(2))  # the deleted key never comes back from an old copy
    assert index.by_digest == {}


async def _conflicts(store: RecordStore) -> None:
    first = await store.write(key(), 0)
    with pytest.raises(Conflict):
        await store.write(key(), 0)  # made twice: the second saw no record, one exists
    a = await store.write({**first, "rpm": 1}, first["version"])
    with pytest.raises(Conflict):  # a writer that read the first version, late
        await store.write({**first, "rpm": 2}, first["version"])
    assert a["version"] > first["version"] == 1
    assert (await store.get("k:key_0123456789abcdef"))["rpm"] == 1
    assert await store.version() == a["version"]
    changed = await store.changes(first["version"])
    assert [r["version"] for r in changed] == [a["version"]]
    await store.aclose()


def test_sqlite_writes_are_versioned(tmp_path: Path):
    asyncio.run(_conflicts(SqliteStore(tmp_path)))


def test_redis_writes_are_versioned(redis: RedisServer):
    asyncio.run(_conflicts(RedisKeyStore(redis.url, 1.0, password=None, cluster=False)))
