"""Money fails closed when Redis comes back (docs/spec.md §20): a request admitted in this
process while Redis could not answer is counted in Redis's reservations before Redis admits
anything new, so one replica cannot spend a budget twice across an outage.

The reproduction: one replica, a $0.10 total budget, requests that reserve and cost ~$0.065
each. Redis stops (or is paused with the breaker open), a first request is admitted per process
and is still running when Redis is back; a second request must then be refused (429
``budget_exceeded``: the first one's reservation holds the rest), not admitted ($0.13 spent).

Real parts: the gateway as a server on loopback, a real ``redis-server`` stopped or paused by
its own PID (tests/redis_support.py), an upstream that holds its answers until told.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from tests.redis_support import RedisServer
from tests.spend_support import AccessLines, Figures, UsageUpstream
from tests.support import GatewayServer, ScriptedUpstream, digest, gateway_config
from tests.test_spend import KEY_A, KEY_TPM, MSG, keys_toml, post

#: max_tokens 6500 at $10/M output: each request reserves ~$0.065 and costs ~$0.065
BIG = orjson.dumps({"model": "gpt-4o", "messages": MSG, "max_tokens": 6500})
BIG_FIGURES = Figures(input=20, output=6500)
BIG_COST = 20 * 2500 + 6500 * 10_000  # nano-USD
#: a small request of the tpm key (its admissions go to Redis too)
SMALL = orjson.dumps({"model": "gpt-4o", "messages": MSG, "max_tokens": 10})


@pytest.fixture(scope="module")
def usage() -> Iterator[UsageUpstream]:
    state = UsageUpstream()
    server = ScriptedUpstream(state.handler()).start()
    state.url = server.url  # type: ignore[attr-defined]
    yield state
    server.stop()


@pytest.fixture
def lines() -> Iterator[AccessLines]:
    with AccessLines() as log:
        yield log


def _budget_in(redis: RedisServer) -> tuple[int, int]:
    """(spent, reserved) of KEY_A's budget as Redis holds it."""
    name = ("gateway:spend:v1:{team-a}:key:" + digest(KEY_A)[:32]).encode()
    out = []
    for field in (b" p", b" r"):
        reply = redis.command(b"HGET " + name + field).strip()
        out.append(int(reply) if reply not in (b"", b"$-1") else 0)
    return out[0], out[1]


def _wait_arrived(usage: UsageUpstream, n: int) -> None:
    deadline = time.monotonic() + 10
    while usage.arrived < n:
        assert time.monotonic() < deadline, "the first request never reached the upstream"
        time.sleep(0.01)


@pytest.mark.parametrize("outage", ["stopped", "paused"])
def test_a_request_admitted_while_redis_was_away_is_counted_when_it_returns(usage, lines, outage):
    usage.figures, usage.arrived, usage.deaf, usage.hold = BIG_FIGURES, 0, False, None
    with RedisServer() as redis:
        toml = keys_toml(
            usage.url,  # type: ignore[attr-defined]
            extra=f'redis_url = "{redis.url}"\ntimeout_ms = 200',
            key_a='budget_usd = 0.10\nbudget_period = "total"',
        )
        gw = GatewayServer(gateway_config(toml)).start()
        try:
            if outage == "stopped":
                redis.stop()
            else:  # paused, and the breaker open: the first admission never reaches Redis
                redis.pause()
                usage.figures = Figures(input=5, output=5)
                for _ in range(3):  # three admissions of another metered key time out
                    assert post(gw, KEY_TPM, SMALL).status_code == 200
            usage.figures, arrived = BIG_FIGURES, usage.arrived
            usage.hold = threading.Event()
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                first = pool.submit(post, gw, KEY_A, BIG)
                _wait_arrived(usage, arrived + 1)  # admitted per process, now running
                if outage == "stopped":
                    redis.start()
                else:
                    redis.resume()
                    time.sleep(5.5)  # the breaker lets calls through again
                second = pool.submit(post, gw, KEY_A, BIG)
                deadline = time.monotonic() + 10  # refused at once, or admitted and held
                while not second.done() and usage.arrived < arrived + 2:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                usage.hold.set()
                assert first.result().status_code == 200
            spent = sum(
                round(line["cost_usd"] * 1e9) for line in lines.lines if line["tenant"] == "team-a"
            )
            assert second.result().status_code == 429, f"admitted: ${spent / 1e9} spent"
            second = second.result()
            err = second.json()["error"]
            assert (err["type"], err["code"]) == ("insufficient_quota", "budget_exceeded")
            deadline = time.monotonic() + 5
            while _budget_in(redis) != (BIG_COST, 0) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _budget_in(redis) == (BIG_COST, 0)
            # the refused one is answered first, the held one once the upstream answers
            statuses = [line["status"] for line in lines.lines if line["tenant"] == "team-a"]
            assert statuses == [429, 200]
        finally:
            if usage.hold is not None:
                usage.hold.set()
            usage.hold = None
            gw.stop()
