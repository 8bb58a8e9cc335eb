"""Two replicas (``gateway serve`` processes) over one real redis-server (docs/spec.md §28): a
key created, blocked, rotated and deleted on one is in force on the other within a second,
under a background loop of requests, and never comes back; Redis stopped, the known keys are
still served and ``/readyz`` says ``degraded``; no secret reaches either process's log."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.admin.admin_support import ADMIN_KEY, admin, admin_toml, chat, code, wait_for
from tests.redis_support import RedisServer
from tests.support import Process, free_port, gateway_cli

#: the promise: a change is in force on every replica within this
IN_FORCE_S = 1.0
CONFIG_KEY = "config-key-" + "r" * 30


class Replicas:
    def __init__(self, redis: RedisServer, tmp_path: Path) -> None:
        digest = hashlib.sha256(CONFIG_KEY.encode()).hexdigest()
        extra = f'redis_url = "{redis.url}"\n[[auth.keys]]\ntenant = "ops"\nsha256 = "{digest}"'
        toml = admin_toml(extra) + '[logging]\naccess_log = "off"\n[ui]\nenabled = false\n'
        path = tmp_path / "gateway.toml"
        path.write_text(toml)
        self.procs = [self._serve(path, tmp_path / f"data{i}") for i in range(2)]
        self.a, self.b = (p.url for p in self.procs)

    @staticmethod
    def _serve(path: Path, data: Path) -> Process:
        port = free_port()
        args = gateway_cli("serve", "-c", str(path), "--port", str(port))
        return Process(args, port, {"XDG_DATA_HOME": str(data)})

    def output(self) -> str:
        return "".join(p.stop() for p in self.procs)


@pytest.fixture
def replicas(redis: RedisServer, tmp_path: Path) -> Iterator[Replicas]:
    pair = Replicas(redis, tmp_path)
    try:
        yield pair
    finally:
        pair.output()


class Load:
    """A background loop of requests to a replica with the config's key (all must succeed)."""

    def __init__(self, url: str) -> None:
        self.url, self.sent, self.failed = url, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx2.Client(timeout=5) as client:
            while not self._stop.is_set():
                body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}
                headers = {"authorization": f"Bearer {CONFIG_KEY}"}
                answer = client.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)
                self.sent += 1
                if answer.status_code != 200:
                    self.failed.append(answer.status_code)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def status(url: str, secret: str) -> str | int:
    answer = chat(url, secret)
    return 200 if answer.status_code == 200 else (code(answer) or answer.status_code)


def test_changes_on_one_replica_are_in_force_on_the_other(replicas: Replicas):
    a, b = replicas.a, replicas.b
    with Load(b) as load:
        made = admin(a, "POST", "keys", {"tenant": "team-a", "models": ["gpt-4o*"]}).json()
        secret, key_id = made["key"], made["id"]
        wait_for(lambda: status(b, secret) == 200, "made on A, served by B", IN_FORCE_S)
        admin(a, "POST", f"keys/{key_id}/block")
        wait_for(lambda: status(b, secret) == "key_blocked", "blocked on B", IN_FORCE_S)
        admin(a, "POST", f"keys/{key_id}/unblock")
        wait_for(lambda: status(b, secret) == 200, "unblocked on B", IN_FORCE_S)
        new = admin(a, "POST", f"keys/{key_id}/rotate", {"grace_s": 0}).json()["key"]
        wait_for(lambda: status(b, new) == 200, "the new secret on B", IN_FORCE_S)
        assert status(b, secret) == "invalid_api_key"
        admin(a, "DELETE", f"keys/{key_id}")
        wait_for(lambda: status(b, new) == "invalid_api_key", "deleted on B", IN_FORCE_S)
        # never back: several catch-up polls later, on both replicas, for both secrets
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            for url in (a, b):
                assert status(url, new) == status(url, secret) == "invalid_api_key"
        assert admin(b, "GET", f"keys/{key_id}").status_code == 404
    assert load.sent > 0 and load.failed == []
    log = replicas.output()
    assert "key.rotate" in log and "key.delete" in log and key_id in log
    for s in (secret, new, ADMIN_KEY, CONFIG_KEY):
        assert s not in log


def test_a_budget_raised_on_one_replica_admits_the_next_request_on_the_other(
    replicas: Replicas,
):
    a, b = replicas.a, replicas.b
    made = admin(a, "POST", "keys", {"tenant": "t", "budget_usd": 1e-7}).json()
    wait_for(lambda: status(b, made["key"]) == "budget_exceeded", "known on B", IN_FORCE_S)
    admin(a, "PATCH", f"keys/{made['id']}", {"budget_usd": 10})
    wait_for(lambda: status(b, made["key"]) == 200, "the raised budget on B", IN_FORCE_S)


def test_redis_stopped_the_known_keys_are_served_and_readiness_says_so(
    replicas: Replicas, redis: RedisServer
):
    a, b = replicas.a, replicas.b
    secret = admin(a, "POST", "keys", {"tenant": "t"}).json()["key"]
    wait_for(lambda: status(b, secret) == 200, "made on A, served by B", IN_FORCE_S)
    redis.stop()

    def degraded() -> bool:
        ready = httpx2.get(f"{b}/readyz")
        body = ready.json()
        assert ready.status_code == 200
        return body["status"] == "degraded" and body["degraded"] == ["key_store"]

    wait_for(degraded, "readyz degraded on B", 10)
    for url in (a, b):
        assert status(url, secret) == 200
        assert status(url, CONFIG_KEY) == 200
    down = admin(a, "POST", "keys", {"tenant": "t"})
    assert down.status_code == 503 and code(down) == "key_store_unavailable"
    redis.start()  # empty (no AOF in tests): the replicas read it again from the start
    wait_for(lambda: httpx2.get(f"{b}/readyz").json()["status"] == "ready", "ready again", 10)
    again = admin(a, "POST", "keys", {"tenant": "t"}).json()["key"]
    wait_for(lambda: status(b, again) == 200, "a key made after the outage, on B", IN_FORCE_S)


def test_concurrent_changes_on_two_replicas_are_both_kept(replicas: Replicas):
    """Each change is written with the version it read: two replicas changing one key at once
    lose neither change (the later writer reads again), and both replicas end on the same."""
    a, b = replicas.a, replicas.b
    made = admin(a, "POST", "keys", {"tenant": "t"}).json()
    path = f"keys/{made['id']}"
    answers: list[int] = []

    def change(url: str, field: str, value: int) -> None:
        answers.append(admin(url, "PATCH", path, {field: value}).status_code)

    for round_ in range(1, 6):
        writers = [
            threading.Thread(target=change, args=(a, "rpm", round_)),
            threading.Thread(target=change, args=(b, "tpm", 1000 + round_)),
        ]
        for w in writers:
            w.start()
        for w in writers:
            w.join(10)
    assert answers == [200] * 10

    def held(url: str) -> tuple[int, int]:  # the listing is each replica's in-memory index
        listed = admin(url, "GET", "keys").json()["data"]
        mine = next(k for k in listed if k["id"] == made["id"])
        return mine["rpm"], mine["tpm"]

    for url in (a, b):
        wait_for(lambda url=url: held(url) == (5, 1005), "both changes kept", IN_FORCE_S)


def test_a_rotated_secret_works_for_its_grace_only(replicas: Replicas):
    a, b = replicas.a, replicas.b
    made = admin(a, "POST", "keys", {"tenant": "t"}).json()
    wait_for(lambda: status(b, made["key"]) == 200, "made on A, served by B", IN_FORCE_S)
    new = admin(a, "POST", f"keys/{made['id']}/rotate", {"grace_s": 1.5}).json()["key"]
    wait_for(lambda: status(b, new) == 200, "the new secret on B", IN_FORCE_S)
    assert status(b, made["key"]) == 200  # in its grace
    wait_for(lambda: status(b, made["key"]) == "invalid_api_key", "the grace over", 5)
    assert status(b, new) == 200
