"""What a realtime session costs through the gateway (docs/spec.md §19): per-frame delay and
memory per idle session. Prints a markdown table; not a test (no assertion on speed).

    python loadtests/realtime.py [--seconds 5] [--gateway-cpu 0] [--idle 1000] [--skip-idle]

Three processes, as in production: an echo upstream (``websockets``' server, its own process),
``gateway serve`` on one core (``taskset -c --gateway-cpu``; one worker), and this client. The
client sends timestamped text messages at a fixed rate on each session and the upstream echoes
each one back; the round trip is measured once straight to the upstream and once through the
gateway, same client, same rate. A message crosses the gateway twice (client → upstream and
back), so the added per-frame delay is half the difference of the round trips, taken per
percentile. Beside it, the gateway's own reading of the same thing: its
``gateway_realtime_message_overhead_seconds`` histogram (read → written, per message and
direction) from ``/metrics``, as bucket bounds (p50 ≤ 0.1 ms shows as "≤ 0.1").

Rows: one session at 100 and 1,000 messages/s; 200 concurrent sessions at 100 and 1,000
messages/s in total. Then RSS: the gateway's resident memory before and after ``--idle``
sessions are opened and left idle, per session.

Targets (issue 25): added per-frame p50 ≤ 0.1 ms and p99 ≤ 1 ms on one core; ≤ 50 KiB RSS per
idle session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from websockets.asyncio.client import connect  # noqa: E402

from tests.support import free_port, wait_port  # noqa: E402

ECHO = """
import asyncio, logging, sys
from websockets.asyncio.server import serve

logging.getLogger("websockets").setLevel(logging.CRITICAL)  # wait_port's bare TCP probe

async def echo(ws):
    async for message in ws:
        await ws.send(message)

async def main():
    async with serve(echo, "127.0.0.1", int(sys.argv[1]), compression=None, max_size=None,
                     ping_interval=None):
        await asyncio.Future()

asyncio.run(main())
"""

CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
[[backends]]
name = "echo"
url = "http://127.0.0.1:{upstream}/v1"
[[routes]]
models = ["*"]
backends = ["echo"]
[logging]
access_log = "off"
level = "warning"
[ui]
enabled = false
"""


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def session(url: str, rate: float, seconds: float, rtts: list[float]) -> None:
    """One session sending ``rate`` messages/s for ``seconds``, each echoed back."""
    async with connect(url, compression=None, max_size=None, open_timeout=30) as ws:
        payload = '{"type":"input_text.bench","pad":"' + "x" * 200 + '","t":'

        async def reader() -> None:
            async for message in ws:
                sent = float(str(message).rsplit(":", 1)[1].rstrip("}"))
                rtts.append(time.perf_counter() - sent)

        task = asyncio.create_task(reader())
        gap = 1.0 / rate
        start = time.perf_counter()
        n = 0
        while (now := time.perf_counter()) - start < seconds:
            await ws.send(f"{payload}{now!r}}}")
            n += 1
            delay = start + n * gap - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.sleep(0.2)  # the last echoes
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def load(url: str, sessions: int, total_rate: float, seconds: float) -> list[float]:
    rtts: list[float] = []
    await asyncio.gather(
        *(session(url, total_rate / sessions, seconds, rtts) for _ in range(sessions))
    )
    return rtts


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def metrics_text(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def delta_histogram(before: str, after: str, q: float) -> str:
    """Quantile of the observations made between two scrapes."""
    from prometheus_client.parser import text_string_to_metric_families

    def buckets(text: str) -> dict[float, float]:
        out: dict[float, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "gateway_realtime_message_overhead_seconds":
                for s in family.samples:
                    if s.name.endswith("_bucket"):
                        le = float(s.labels["le"])
                        out[le] = out.get(le, 0.0) + s.value
        return out

    b, a = buckets(before), buckets(after)
    diff = {le: a[le] - b.get(le, 0.0) for le in a}
    if not diff or diff[max(diff)] <= 0:
        return "-"
    total = diff[max(diff)]
    for le in sorted(diff):
        if diff[le] >= q * total:
            return "≤ " + f"{le * 1000:g}"
    return "-"


async def idle_rss(url: str, pid: int, count: int) -> tuple[int, int]:
    before = rss_kib(pid)
    sockets = []
    try:
        for i in range(0, count, 50):
            batch = await asyncio.gather(
                *(
                    connect(url, compression=None, open_timeout=60, ping_interval=None)
                    for _ in range(min(50, count - i))
                )
            )
            sockets.extend(batch)
        await asyncio.sleep(1.0)
        after = rss_kib(pid)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return before, after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--gateway-cpu", default="0", help="taskset CPU list for the gateway")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--skip-idle", action="store_true")
    args = parser.parse_args()
    raise_fd_limit()
    up_port, gw_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "gateway.toml"
        cfg.write_text(CONFIG.format(port=gw_port, upstream=up_port))
        try:
            procs.append(subprocess.Popen([sys.executable, "-c", ECHO, str(up_port)]))
            taskset = ["taskset", "-c", args.gateway_cpu] if args.gateway_cpu else []
            gw = subprocess.Popen(
                [*taskset, sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)],
                cwd=ROOT,
            )
            procs.append(gw)
            wait_port(up_port, 30)
            wait_port(gw_port, 30)
            asyncio.run(run(args, up_port, gw_port, gw.pid))
        finally:
            for p in reversed(procs):  # ours, by handle
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
    return 0


async def run(args: argparse.Namespace, up_port: int, gw_port: int, gw_pid: int) -> None:
    direct = f"ws://127.0.0.1:{up_port}/v1/realtime?model=bench"
    via = f"ws://127.0.0.1:{gw_port}/v1/realtime?model=bench"
    await load(via, 1, 50, 1.0)  # warm up (imports, first connections)
    rows = []
    for sessions, rate in ((1, 100), (1, 1000), (200, 100), (200, 1000)):
        d = await load(direct, sessions, rate, args.seconds)
        before = metrics_text(gw_port)
        g = await load(via, sessions, rate, args.seconds)
        after = metrics_text(gw_port)
        added50 = (pct(g, 50) - pct(d, 50)) / 2 * 1000
        added99 = (pct(g, 99) - pct(d, 99)) / 2 * 1000
        rows.append(
            (
                f"{sessions} session{'s' if sessions > 1 else ''}",
                f"{rate:,}",
                len(g),
                f"{pct(d, 50) * 1000:.3f} / {pct(d, 99) * 1000:.3f}",
                f"{pct(g, 50) * 1000:.3f} / {pct(g, 99) * 1000:.3f}",
                f"{added50:.3f}",
                f"{added99:.3f}",
                delta_histogram(before, after, 0.5),
                delta_histogram(before, after, 0.99),
            )
        )
    print(f"\nrealtime relay, gateway on CPU {args.gateway_cpu or 'any'}, {args.seconds:g} s a row")
    print(
        "| sessions | msg/s (total) | messages | direct RTT p50 / p99 ms"
        " | via gateway RTT p50 / p99 ms | added per frame p50 ms | added per frame p99 ms"
        " | gateway histogram p50 ms | gateway histogram p99 ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    if not args.skip_idle:
        before, after = await idle_rss(via, gw_pid, args.idle)
        per = (after - before) / args.idle
        print("\n| idle sessions | gateway RSS before | after | per session |")
        print("|---|---|---|---|")
        print(f"| {args.idle} | {before:,} KiB | {after:,} KiB | {per:.1f} KiB |")


if __name__ == "__main__":
    raise SystemExit(main())
