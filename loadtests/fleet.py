"""Fleet-aware routing under a real queueing load (docs/spec.md §21): p99 by strategy.

    python loadtests/fleet.py [--duration 30] [--load 0.85] [--scenario unequal|equal ...]
                              [--variant NAME ...] [--seed 1] [--list]

It starts, each as its own process stopped by its own PID at the end:

- two model servers, ``gateway mock-upstream --capacity N`` (at most N requests run at once, the
  others wait in a real FIFO queue, ``/metrics`` reports both in vLLM's names); every answer
  takes the same time in its slot (``--ttft-ms``, ``--tokens-per-s``, ``--output-tokens``);
- for each variant, two gateway replicas (``gateway serve``, one process each, the same config):
  they share nothing, so neither sees the other's in-flight requests — as two pods behind a
  Service.

Then an open-loop Poisson arrival process at ``--load`` times the fleet's capacity (requests per
second the two servers can serve) sends chat completions for ``--duration`` seconds, each to one
replica chosen at random; the first ``WARMUP_S`` seconds are not counted. Latency is the
client's: from sending the request to its last byte, queueing in the model server included.

Scenarios (the servers' capacities): ``unequal`` 2 + 6 slots (two GPUs of different size, or
tensor-parallel degrees), ``equal`` 4 + 4, and ``shared`` 4 + 4 where other clients — another
gateway deployment, a batch job — also send server a half of what it can serve, directly: load
no gateway replica can count, only a's own metrics show. Variants: ``ordered`` and
``least_outstanding`` without metrics (how a route balanced before docs/spec.md §21), the same
two with each backend's ``metrics_url`` (saturated backends skipped under every strategy), and
``least_loaded``.

Prints one markdown table per scenario: requests counted, req/s served, client latency p50 / p90
/ p99 / max, errors, and which share each backend served (from the gateways' own
``gateway_upstream_duration_seconds_count``). Exit status 0, or 2 for bad arguments. All traffic
stays on 127.0.0.1; temp files live in one temp dir that is removed at the end. A request not
answered within ``CLIENT_TIMEOUT_S`` is given up and counted at that latency, so a percentile
it reaches is a lower bound (shown as ``≥``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

# the process helpers the soak uses (the script's folder is on sys.path when run as a script)
from soak import free_port, started

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 20.0
WARMUP_S = 3.0
#: every answer's time in its slot: TTFT + OUTPUT_TOKENS / TOKENS_PER_S
TTFT_MS = 200
TOKENS_PER_S = 50
OUTPUT_TOKENS = 30
#: the backends' metrics_interval_ms: well below an answer's time, as 250 ms is for a real LLM
#: answer of seconds (the answers here are short so that a run is short)
SCRAPE_MS = 100
SERVICE_S = TTFT_MS / 1000 + OUTPUT_TOKENS / TOKENS_PER_S

#: a request not answered by then is given up and counted at this latency (a lower bound)
CLIENT_TIMEOUT_S = 60.0

#: scenario -> (the servers' capacities, the share of a's capacity other clients use directly)
SCENARIOS: dict[str, tuple[tuple[int, int], float]] = {
    "unequal": ((2, 6), 0.0),
    "equal": ((4, 4), 0.0),
    "shared": ((4, 4), 0.5),
}
#: variant -> (route TOML, whether the backends name their metrics_url)
VARIANTS: dict[str, tuple[str, bool]] = {
    "ordered": ('strategy = "ordered"', False),
    "least_outstanding": ('strategy = "least_outstanding"', False),
    "ordered+metrics": ('strategy = "ordered"', True),
    "least_outstanding+metrics": ('strategy = "least_outstanding"', True),
    "least_loaded": ('strategy = "least_loaded"', True),
}


# ---------------------------------------------------------------- processes


def gateway_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


def mock_server(port: int, capacity: int) -> list[str]:
    knobs = {"--ttft-ms": TTFT_MS, "--tokens-per-s": TOKENS_PER_S, "--output-tokens": OUTPUT_TOKENS}
    args = ["mock-upstream", "--port", str(port), "--capacity", str(capacity)]
    return gateway_cli(*args, *(str(x) for kv in knobs.items() for x in kv))


def gateway_toml(port: int, servers: list[int], route: str, metrics: bool) -> str:
    text = (
        f'[server]\nport = {port}\nshutdown_grace_s = 5\n\n[logging]\naccess_log = "off"\n'
        'level = "error"\n\n[cache]\nbackend = "off"\n\n'
    )
    for name, up in zip("ab", servers, strict=True):
        text += f'[[backends]]\nname = "{name}"\nurl = "http://127.0.0.1:{up}/v1"\n'
        text += "read_timeout_s = 120\nmax_connections = 1000\n"
        if metrics:  # max_queue 5, max_kv_cache 0.8: the defaults
            text += f'metrics_url = "http://127.0.0.1:{up}/metrics"\n'
            text += f"metrics_interval_ms = {SCRAPE_MS}\n"
        text += "\n"
    return text + f'[[routes]]\nmodels = ["*"]\nbackends = ["a", "b"]\nretries = 0\n{route}\n'


def metrics_of(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def served_by_backend(ports: list[int]) -> dict[str, float]:
    """Upstream answers per backend, summed over the gateway replicas."""
    out: dict[str, float] = {}
    for port in ports:
        for family in text_string_to_metric_families(metrics_of(port)):
            for s in family.samples:
                if s.name == "gateway_upstream_duration_seconds_count":
                    out[s.labels["backend"]] = out.get(s.labels["backend"], 0.0) + s.value
    return out


def idle(ports: list[int]) -> None:
    """Wait until no model server runs or queues anything (a variant's leftovers drained)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        busy = 0.0
        for port in ports:
            for family in text_string_to_metric_families(metrics_of(port)):
                busy += sum(s.value for s in family.samples if "num_requests" in s.name)
        if not busy:
            return
        time.sleep(0.1)


def known_load(ports: list[int]) -> None:
    """Wait until each gateway replica has scraped both servers."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(metrics_of(p).count("gateway_backend_queue_depth{") == 2 for p in ports):
            return
        time.sleep(0.05)
    raise RuntimeError("the gateways did not scrape the model servers")


# ---------------------------------------------------------------- load


@dataclass
class Result:
    latencies: list[float]
    errors: int
    #: requests given up after CLIENT_TIMEOUT_S (in ``latencies`` at that value)
    timeouts: int
    #: from the first counted request sent to the last answer received
    served_s: float
    share: dict[str, float]


async def drive(
    ports: list[int], rate: float, duration: float, seed: int, external: tuple[int, float]
) -> tuple[list[float], int, int, float]:
    """Open-loop Poisson arrivals at ``rate``/s for ``duration`` s, each to a random replica;
    ``external``: (a model server's port, a rate) of requests sent to it directly, by clients
    no gateway sees (not counted)."""
    rng = random.Random(seed)
    latencies: list[float] = []
    errors = timeouts = 0
    last = 0.0
    start = time.perf_counter()
    counted_from = start + WARMUP_S
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    tasks: set[asyncio.Task[None]] = set()

    async def one(session: aiohttp.ClientSession, port: int, n: int) -> None:
        nonlocal errors, timeouts, last
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"q {n}"}]})
        sent = time.perf_counter()
        timed_out = False
        try:
            async with session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                data=body,
                headers={"content-type": "application/json"},
            ) as resp:
                await resp.read()
                ok = resp.status == 200
        except TimeoutError:
            ok, timed_out = False, True
        except aiohttp.ClientError:
            ok = False
        if sent >= counted_from:
            done = time.perf_counter()
            last = max(last, done)
            if ok:
                latencies.append(done - sent)
            elif timed_out:
                latencies.append(CLIENT_TIMEOUT_S)
                timeouts += 1
            else:
                errors += 1

    async def outside(session: aiohttp.ClientSession, port: int, n: int) -> None:
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"x {n}"}]})
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                data=body,
                headers={"content-type": "application/json"},
            ) as resp:
                await resp.read()

    async def arrivals(session: aiohttp.ClientSession, rate: float, send: Any, rng: Any) -> None:
        at = start
        n = 0
        while at < start + duration:
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            task = asyncio.create_task(send(session, n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loops = [arrivals(session, rate, lambda s, n: one(s, rng.choice(ports), n), rng)]
        port, outside_rate = external
        if outside_rate:
            other = random.Random(seed + 1)
            loops.append(arrivals(session, outside_rate, lambda s, n: outside(s, port, n), other))
        await asyncio.gather(*loops)
        await asyncio.gather(*tasks)
    return latencies, errors, timeouts, last - counted_from


def run_variant(
    tmp: Path,
    name: str,
    servers: list[int],
    rate: float,
    duration: float,
    seed: int,
    external: tuple[int, float],
) -> Result:
    route, metrics = VARIANTS[name]
    ports = [free_port(), free_port()]
    with contextlib.ExitStack() as stack:
        for i, port in enumerate(ports):
            cfg = tmp / f"{name}-{i}.toml"
            cfg.write_text(gateway_toml(port, servers, route, metrics))
            stack.enter_context(
                started(
                    gateway_cli("serve", "-c", str(cfg)),
                    port,
                    tmp / f"{name}-{i}.log",
                    f"gateway replica {i}",
                )
            )
        if metrics:
            known_load(ports)
        before = served_by_backend(ports)
        latencies, errors, timeouts, served_s = asyncio.run(
            drive(ports, rate, duration, seed, external)
        )
        after = served_by_backend(ports)
    share = {b: after.get(b, 0.0) - before.get(b, 0.0) for b in ("a", "b")}
    idle(servers)
    return Result(latencies, errors, timeouts, served_s, share)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float) -> str:
    """Milliseconds; a lower bound (``≥``) where given-up requests reach that far."""
    return ("≥" if seconds >= CLIENT_TIMEOUT_S else "") + f"{seconds * 1000:.0f}"


def table(
    scenario: str,
    caps: tuple[int, int],
    rate: float,
    outside_rate: float,
    results: dict[str, Result],
) -> str:
    outside = (
        f" + {outside_rate:.1f} req/s sent to a directly by clients no gateway sees"
        if outside_rate
        else ""
    )
    used = (rate + outside_rate) * SERVICE_S / sum(caps)
    lines = [
        f"### {scenario}: capacities a={caps[0]}, b={caps[1]}; {rate:.1f} req/s through the "
        f"gateways{outside} ({used:.0%} of capacity), {SERVICE_S * 1000:.0f} ms per answer in "
        "its slot, two gateway replicas",
        "",
        "| variant | requests | served/s | p50 ms | p90 ms | p99 ms | max ms | given up | "
        "errors | a : b |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        lat = r.latencies
        served = len(lat) - r.timeouts
        total = sum(r.share.values()) or 1.0
        share = f"{r.share['a'] / total:.0%} : {r.share['b'] / total:.0%}"
        lines.append(
            f"| {name} | {len(lat)} | {served / r.served_s:.1f} | {_ms(quantile(lat, 0.5))} | "
            f"{_ms(quantile(lat, 0.9))} | {_ms(quantile(lat, 0.99))} | "
            f"{_ms(max(lat, default=float('nan')))} | {r.timeouts} | {r.errors} | {share} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per variant")
    p.add_argument("--load", type=float, default=0.85, help="offered load / fleet capacity")
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    p.add_argument("--variant", action="append", choices=list(VARIANTS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--list", action="store_true", help="list the variants and exit")
    args = p.parse_args(argv)
    if not WARMUP_S < args.duration <= 600 or not 0 < args.load <= 2:
        p.error("--duration must be in (3, 600] and --load in (0, 2]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, (route, metrics) in VARIANTS.items():
            print(f"{name:28} {route}{', metrics_url on each backend' if metrics else ''}")
        return 0
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp_dir:
        tmp = Path(tmp_dir)
        for scenario in args.scenario or list(SCENARIOS):
            caps, share = SCENARIOS[scenario]
            outside_rate = share * caps[0] / SERVICE_S
            rate = args.load * (sum(caps) / SERVICE_S - outside_rate)
            servers = [free_port(), free_port()]
            external = (servers[0], outside_rate)
            with contextlib.ExitStack() as stack:
                for name, cap, port in zip("ab", caps, servers, strict=True):
                    stack.enter_context(
                        started(
                            mock_server(port, cap),
                            port,
                            tmp / f"server-{name}.log",
                            f"model server {name}",
                        )
                    )
                results = {
                    name: run_variant(tmp, name, servers, rate, args.duration, args.seed, external)
                    for name in args.variant or list(VARIANTS)
                }
            print(table(scenario, caps, rate, outside_rate, results), flush=True)
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
