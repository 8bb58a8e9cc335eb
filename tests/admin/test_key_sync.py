"""The index follows the store's change feed (docs/spec.md §28) whatever a replica did in
between: its own writes and admin reads do not move what it has read of the feed past changes of
another replica it has not read yet (a dropped subscription leaves the poll to catch up), and a
Redis that came back empty while a replica was paused is noticed by its epoch, even when the
other replica wrote past what the paused one had seen."""

from __future__ import annotations

import os
import signal

import redis as redis_sync

from gateway.keys.index import KeyIndex
from tests.admin.admin_support import admin, chat, wait_for
from tests.admin.test_replicas import Replicas, replicas
from tests.redis_support import RedisServer

__all__ = ["replicas"]


def _record(version: int) -> dict[str, object]:
    return {"kind": "tenant", "name": f"t{version}", "version": version}


def test_only_a_read_of_the_feed_moves_seen() -> None:
    index = KeyIndex()
    assert index.apply(_record(5))  # a write of its own, or a fresh read
    assert index.seen == 0
    assert index.apply(_record(3), read=True)
    assert index.seen == 3


def _drop_subscriptions(redis: RedisServer) -> None:
    """Close every pub/sub connection (what the catch-up poll is there for)."""
    with redis_sync.Redis.from_url(redis.url) as client:
        client.client_kill_filter(_type="pubsub")


def test_a_write_on_b_does_not_hide_a_delete_on_a(replicas: Replicas, redis: RedisServer) -> None:
    a, b = replicas.a, replicas.b
    made = admin(a, "POST", "keys", {"tenant": "t1"}).json()
    wait_for(lambda: chat(b, made["key"]).status_code == 200, "the key works on B")
    _drop_subscriptions(redis)
    assert admin(a, "DELETE", f"keys/{made['id']}").status_code == 200
    assert admin(b, "POST", "keys", {"tenant": "t2"}).status_code == 201  # a later version, on B
    assert chat(a, made["key"]).status_code == 401
    wait_for(lambda: chat(b, made["key"]).status_code == 401, "the deleted key refused on B")


def test_an_admin_read_on_b_does_not_hide_a_delete(replicas: Replicas, redis: RedisServer) -> None:
    a, b = replicas.a, replicas.b
    made = admin(a, "POST", "keys", {"tenant": "t1"}).json()
    wait_for(lambda: chat(b, made["key"]).status_code == 200, "the key works on B")
    _drop_subscriptions(redis)
    assert admin(a, "DELETE", f"keys/{made['id']}").status_code == 200
    other = admin(a, "POST", "keys", {"tenant": "t2"}).json()
    assert admin(b, "GET", f"keys/{other['id']}").status_code == 200  # a fresh read, on B
    wait_for(lambda: chat(b, made["key"]).status_code == 401, "the deleted key refused on B")


def test_a_replica_paused_across_an_empty_restart_notices_it(
    replicas: Replicas, redis: RedisServer
) -> None:
    a, b = replicas.a, replicas.b
    made = admin(a, "POST", "keys", {"tenant": "t1"}).json()
    for _ in range(3):
        admin(a, "POST", "keys", {"tenant": "t1"})
    wait_for(lambda: chat(b, made["key"]).status_code == 200, "the key works on B")
    pid_b = replicas.procs[1].proc.pid
    os.kill(pid_b, signal.SIGSTOP)  # a frozen container, a long pause, a partition
    try:
        redis.restart()  # no persistence: the store comes back empty
        wait_for(lambda: chat(a, made["key"]).status_code == 401, "A noticed the reset")
        for _ in range(8):  # the new store's counter passes what B has seen
            assert admin(a, "POST", "keys", {"tenant": "t2"}).status_code == 201
    finally:
        os.kill(pid_b, signal.SIGCONT)
    later = admin(a, "POST", "keys", {"tenant": "t3"}).json()
    wait_for(lambda: chat(b, later["key"]).status_code == 200, "B follows the new store")
    assert chat(b, made["key"]).status_code == 401, "a key the store lost is served by B"
