"""Fleet routing at every load shape (docs/spec.md §21): one table, p50 / p99 / req/s
per strategy and row.

    python loadtests/fleet_matrix.py [--duration 15] [--row NAME ...] [--strategy NAME ...]
                                     [--seed 1] [--list]

Each row is a load shape: two model servers (``gateway mock-upstream --capacity N``: at most N
requests run at once, the rest wait in a real FIFO queue, ``/metrics`` in vLLM's names, every
answer :data:`SERVICE_MS` in its slot), one or two gateway replicas (``gateway serve``, one
process each, the same config, sharing nothing — as two pods behind a Service), and clients:

- **closed loop**: N clients, each sending its next request when the last is answered (client
  ``i`` to replica ``i mod replicas``) — below, at and above the fleet's capacity in slots;
- **open loop**: Poisson arrivals at a share of the fleet's capacity (req/s it can serve), each
  to a random replica — arrivals do not slow down when the fleet does;
- **unseen load**: closed-loop clients that send to server ``a`` directly, which no gateway
  replica can count (another deployment, a batch job): only ``a``'s own ``/metrics`` show it.

Strategies: ``ordered`` and ``least_outstanding`` as a route ran them before docs/spec.md §21
(no ``metrics_url``), and ``least_loaded`` with each backend's ``metrics_url`` scraped every
:data:`SCRAPE_MS` ms. Latency is the client's, from sending the request to its last byte (the
model server's queue included); the first :data:`WARMUP_S` seconds are not counted. Prints one
markdown table: per row and strategy the requests counted, req/s served, p50 and p99 ms, and
which share each server served (from the gateways' ``gateway_upstream_duration_seconds_count``);
then, per row, the best p99 and whether ``least_loaded`` is within :data:`WITHIN` of it.

Every process is started here and stopped by its own PID at the end; all traffic stays on
127.0.0.1; temp files live in one temp dir removed at the end. Exit status 0, or 2 for bad
arguments. Timings on a shared machine are noisy: compare the strategies within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

# the helpers of loadtests/fleet.py and soak.py (the script's folder is on sys.path)
from fleet import (
    gateway_cli,
    gateway_toml,
    idle,
    known_load,
    quantile,
    served_by_backend,
)
from soak import free_port, started

#: every answer's time in its slot (``--latency-ms``); least_loaded scrapes every SCRAPE_MS
SERVICE_MS = 200
WARMUP_S = 2.0
CLIENT_TIMEOUT_S = 60.0
#: least_loaded's p99 must be the best or within this share of the best
WITHIN = 0.05

STRATEGIES: dict[str, tuple[str, bool]] = {
    "ordered": ('strategy = "ordered"', False),
    "least_outstanding": ('strategy = "least_outstanding"', False),
    "least_loaded": ('strategy = "least_loaded"', True),
}


@dataclass(frozen=True)
class Row:
    """One load shape."""

    #: the two servers' capacities (slots)
    caps: tuple[int, int]
    #: gateway replicas
    replicas: int
    #: closed loop: the clients; open loop: 0
    clients: int = 0
    #: open loop: offered load ÷ the capacity the gateways' clients have
    load: float = 0.0
    #: closed-loop clients sending to server a directly (load no gateway sees)
    unseen: int = 0

    def describe(self) -> str:
        a, b = self.caps
        slots = a + b
        if self.clients:
            what = f"closed loop, {self.clients} clients ({self.clients / slots:.0%} of slots)"
        else:
            what = f"open loop at {self.load:.0%} of capacity"
        unseen = f", {self.unseen} unseen on a" if self.unseen else ""
        replicas = "1 replica" if self.replicas == 1 else f"{self.replicas} replicas"
        return f"{a}+{b} slots, {what}{unseen}, {replicas}"


ROWS: dict[str, Row] = {
    "unequal-at": Row((4, 1), 2, clients=5),
    "unequal-below": Row((4, 1), 2, clients=3),
    "unequal-above": Row((4, 1), 2, clients=8),
    "unequal-open": Row((4, 1), 2, load=0.85),
    "unequal-one-replica": Row((4, 1), 1, clients=5),
    "equal-at": Row((4, 4), 2, clients=8),
    "equal-open": Row((4, 4), 2, load=0.85),
    "unseen": Row((4, 4), 2, clients=5, unseen=3),
}


@dataclass
class Result:
    latencies: list[float]
    errors: int
    served_s: float
    share: dict[str, float]


# ---------------------------------------------------------------- load


async def post(session: aiohttp.ClientSession, port: int, n: int) -> bool:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"q {n}"}]})
    try:
        async with session.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=body,
            headers={"content-type": "application/json"},
        ) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def drive(row: Row, ports: list[int], server_a: int, duration: float, seed: int) -> Result:
    """The row's clients for ``duration`` s (the unseen ones too, not counted)."""
    rng = random.Random(seed)
    latencies: list[float] = []
    errors = 0
    last = 0.0
    start = time.perf_counter()
    counted_from, end = start + WARMUP_S, start + duration
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0)

    async def one(session: aiohttp.ClientSession, port: int, n: int) -> None:
        nonlocal errors, last
        sent = time.perf_counter()
        ok = await post(session, port, n)
        done = time.perf_counter()
        if sent >= counted_from and sent < end:
            last = max(last, done)
            if ok:
                latencies.append(done - sent)
            else:
                errors += 1

    async def closed(session: aiohttp.ClientSession, port: int, counted: bool) -> None:
        n = 0
        while time.perf_counter() < end:
            if counted:
                await one(session, port, n)
            else:
                await post(session, port, n)
            n += 1

    async def poisson(session: aiohttp.ClientSession, rate: float) -> None:
        tasks: set[asyncio.Task[None]] = set()
        at, n = start, 0
        while at < end:
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            task = asyncio.create_task(one(session, rng.choice(ports), n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        await asyncio.gather(*tasks)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loops = [closed(session, server_a, False) for _ in range(row.unseen)]
        if row.clients:
            loops += [closed(session, ports[i % len(ports)], True) for i in range(row.clients)]
        else:
            slots = sum(row.caps) - row.unseen
            loops.append(poisson(session, row.load * slots * 1000 / SERVICE_MS))
        await asyncio.gather(*loops)
    return Result(latencies, errors, max(last - counted_from, 1e-9), {})


def run_cell(
    tmp: Path, row: Row, strategy: str, servers: list[int], duration: float, seed: int
) -> Result:
    route, metrics = STRATEGIES[strategy]
    ports = [free_port() for _ in range(row.replicas)]
    with contextlib.ExitStack() as stack:
        for i, port in enumerate(ports):
            cfg = tmp / f"{strategy}-{i}.toml"
            cfg.write_text(gateway_toml(port, servers, route, metrics))
            stack.enter_context(
                started(
                    gateway_cli("serve", "-c", str(cfg)), port, tmp / f"gw-{i}.log", f"replica {i}"
                )
            )
        if metrics:
            known_load(ports)
        before = served_by_backend(ports)
        result = asyncio.run(drive(row, ports, servers[0], duration, seed))
        after = served_by_backend(ports)
    result.share = {b: after.get(b, 0.0) - before.get(b, 0.0) for b in ("a", "b")}
    idle(servers)
    return result


def mock_server(port: int, capacity: int) -> list[str]:
    return gateway_cli(
        "mock-upstream",
        "--port",
        str(port),
        "--capacity",
        str(capacity),
        "--latency-ms",
        str(SERVICE_MS),
    )


# ---------------------------------------------------------------- the table


def table(results: dict[str, dict[str, Result]]) -> str:
    lines = [
        "| row | load shape | strategy | requests | req/s | p50 ms | p99 ms | a : b | "
        "least_loaded vs best p99 |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for name, cells in results.items():
        p99 = {s: quantile(r.latencies, 0.99) for s, r in cells.items()}
        best = min(p99.values())
        verdict = ""
        if "least_loaded" in p99:
            ratio = p99["least_loaded"] / best
            verdict = "best" if ratio <= 1.0 else f"+{ratio - 1:.1%}"
            verdict += "" if ratio <= 1 + WITHIN else " (missed)"
        for strategy, r in cells.items():
            total = sum(r.share.values()) or 1.0
            share = f"{r.share['a'] / total:.0%} : {r.share['b'] / total:.0%}"
            errors = f" ({r.errors} errors)" if r.errors else ""
            lines.append(
                f"| {name} | {ROWS[name].describe()} | {strategy} | {len(r.latencies)}{errors} | "
                f"{len(r.latencies) / r.served_s:.1f} | {quantile(r.latencies, 0.5) * 1000:.0f} | "
                f"{p99[strategy] * 1000:.0f} | {share} | "
                f"{verdict if strategy == 'least_loaded' else ''} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=15.0, help="seconds of load per cell")
    p.add_argument("--row", action="append", choices=list(ROWS))
    p.add_argument("--strategy", action="append", choices=list(STRATEGIES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    args = p.parse_args(argv)
    if not WARMUP_S < args.duration <= 600:
        p.error(f"--duration must be in ({WARMUP_S:g}, 600]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, row in ROWS.items():
            print(f"{name:22} {row.describe()}")
        return 0
    results: dict[str, dict[str, Result]] = {}
    with tempfile.TemporaryDirectory(prefix="fleet-matrix-") as tmp_dir:
        tmp = Path(tmp_dir)
        for name in args.row or list(ROWS):
            row = ROWS[name]
            servers = [free_port(), free_port()]
            with contextlib.ExitStack() as stack:
                for label, cap, port in zip("ab", row.caps, servers, strict=True):
                    stack.enter_context(
                        started(
                            mock_server(port, cap), port, tmp / f"{label}.log", f"server {label}"
                        )
                    )
                results[name] = {
                    s: run_cell(tmp, row, s, servers, args.duration, args.seed)
                    for s in args.strategy or list(STRATEGIES)
                }
            print("\n".join(table({name: results[name]}).splitlines()[2:]), flush=True)
    print()
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
