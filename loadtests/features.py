"""What each feature costs per request, in-process: the gateway's CPU with no sockets in the way.

    python loadtests/features.py [--requests 4000] [--rounds 5] [--variant NAME ...] [--list]

``overhead.py`` measures the gateway the way clients see it (wrk, nginx, two cores), and on a
shared virtual machine its req/s move by ±15 % (hypervisor steal, neighbours): a feature that
costs 5 % drowns in that. This script drives the ASGI app directly — the same ``Gateway`` that
``gateway serve`` runs, with the built-in ``mock://`` backend (in-process, no network) — through
``--requests`` chat completions per round, on one thread, and reports the best of ``--rounds``
rounds of CPU time per request (``time.process_time``). The variants take turns round by round,
so what the machine does meanwhile touches them all alike; the startup objects are frozen out of
the garbage collector first, as ``gateway serve`` does. Every variant runs the same requests with
one config difference, so the
difference to ``core`` is what that feature costs the request path. What it leaves out is the
same for every variant: the server edge's HTTP parsing and the socket syscalls (``overhead.py``).

Prints a markdown table: variant, µs of CPU per request, and the difference to ``core``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

import gateway
from gateway.app import Gateway
from gateway.config import load_config

BASE = """
[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
name = "default"
models = ["*"]
backends = ["mock"]
"""
LOG_OFF = '[logging]\naccess_log = "off"\n'  # unless the variant sets its own
#: unless the variant sets its own: the live view is on by default where the gateway listens on
#: loopback (docs/spec.md §18), and the `ui` variant is what it costs
UI_OFF = "[ui]\nenabled = false\n"
NO_CACHE = '[cache]\nbackend = "off"\n'
NO_TRACING = '[tracing]\nexporter = "none"\n'
#: MCP through the gateway (docs/spec.md §23): the built-in server twice, so /mcp, /mcp/a, /mcp/b
MCP_SERVERS = (
    '[[mcp_servers]]\nname = "a"\nurl = "mock://"\n[[mcp_servers]]\nname = "b"\nurl = "mock://"\n'
)
KEY = b"sk-bench"
AUTH = (
    '[auth]\nmode = "keys"\n[[auth.keys]]\ntenant = "bench"\n'
    f'sha256 = "{hashlib.sha256(KEY).hexdigest()}"\n'
)


async def _key_store_with_the_bench_key() -> str:
    """A data directory whose key store (SQLite, docs/spec.md §28) holds the bench key."""
    from gateway.keys.sqlite import SqliteStore

    directory = tempfile.mkdtemp(prefix="gw-features-keys-")
    record = {"kind": "key", "id": "key_00000000000000be", "tenant": "bench", "models": ["*"]}
    record.update(digest=hashlib.sha256(KEY).hexdigest(), prefix="sk-bench", old=[])
    store = SqliteStore(Path(directory))
    await store.write(record, 0)
    await store.aclose()
    return directory


#: docs/spec.md §28: the key store on (its keys served from memory); the bench key from the
#: config (auth-key-store) or from the store itself (auth-stored-key)
ADMIN = '[admin]\nkey_env = "FEATURES_NO_ADMIN_KEY"\ndata_dir = "{}"\n'
#: docs/spec.md §20: the model's price, a budget on the key and one on its tenant: every
#: request is priced at its end, reserves its worst case first and settles it afterwards
PRICES = '[[prices]]\nmodels = ["gpt-4o-mini*"]\ninput = 0.15\noutput = 0.60\n'
BUDGETS = (
    AUTH
    + "budget_usd = 1000000.0\n"
    + '[[auth.tenants]]\nname = "bench"\nbudget_usd = 1000000.0\n'
    + PRICES
)
#: the budget variants through Redis use this one (a redis-server started for the run)
REDIS_URL = "redis://127.0.0.1:{port}/0"
#: docs/spec.md §21: variants over two in-process backends, named by their own BASE
FLEET_ROUTE = '[[routes]]\nname = "default"\nmodels = ["*"]\nbackends = ["a", "b"]\n'
FLEET = (
    '[[backends]]\nname = "a"\nurl = "mock://a"\nprovider = "mock"\n'
    '[[backends]]\nname = "b"\nurl = "mock://b"\nprovider = "mock"\n' + FLEET_ROUTE
)
#: both scraped in process (a capacity no load reaches), every 250 ms
SCRAPED = (
    '[[backends]]\nname = "a"\nurl = "mock://fa?capacity=100000"\nprovider = "mock"\n'
    '[[backends]]\nname = "b"\nurl = "mock://fb?capacity=100000"\nprovider = "mock"\n' + FLEET_ROUTE
)
LEAST_LOADED_PREFIX = 'strategy = "least_loaded"\naffinity = "prefix"\n'
#: a closed port: spans are built, encoded and queued; the export thread's failures are cheap
DEAD_OTLP = '[tracing]\nexporter = "otlp"\nendpoint = "http://127.0.0.1:9"\nsample_ratio = 1.0\n'
#: a live OTLP/HTTP sink of this run's own (``loadtests/otlp_sink.py``, another process): the
#: export thread's work (framing, sending) is counted too — it is this process's CPU
OTLP_URL = "http://127.0.0.1:{port}"
LIVE_OTLP = f'[tracing]\nexporter = "otlp"\nendpoint = "{OTLP_URL}"\nsample_ratio = 1.0\n'
#: overhead.py's everything, in process: metrics, tracing to a live sink, the sampled access log,
#: the live view; with the memory cache missing (a unique prompt per request: ``UNIQUE``)
SAMPLED_LOG = '[logging]\naccess_log = "sampled"\nslow_ms = 500\nsample_ratio = 0.01\n'
TELEMETRY = LIVE_OTLP + SAMPLED_LOG + "[ui]\nenabled = true\n"
MEMORY_CACHE = '[cache]\nbackend = "memory"\nmode = "all"\n'
#: variants whose every request carries a prompt of its own (cache misses)
UNIQUE = frozenset({"everything", "everything-process", "cache-memory-miss"})

VARIANTS: dict[str, tuple[str, str]] = {
    "core": (
        "cache off, tracing none, metrics on, live view off (the baseline)",
        NO_CACHE + NO_TRACING,
    ),
    "core-again": ("core once more, last: the spread of the method", NO_CACHE + NO_TRACING),
    "metrics-off": (
        "core with [metrics] enabled = false",
        NO_CACHE + NO_TRACING + "[metrics]\nenabled = false\n",
    ),
    "access-log-sampled": (
        "core with the sampled JSON access log (1 %; the rest decided before any formatting)",
        NO_CACHE + NO_TRACING + '[logging]\naccess_log = "sampled"\nsample_ratio = 0.01\n',
    ),
    "access-log-all": (
        "core with a JSON access log line for every request (to /dev/null)",
        NO_CACHE + NO_TRACING + '[logging]\naccess_log = "all"\n',
    ),
    "auth-keys": ("core with auth.mode = keys", NO_CACHE + NO_TRACING + AUTH),
    "auth-key-store": (
        "auth-keys with the key store on ([admin]); the key is the config's",
        NO_CACHE + NO_TRACING + AUTH + ADMIN.format("{store}"),
    ),
    "auth-key-store-listen": (
        "auth-key-store with [admin] listen: the admin API off the port the requests come on",
        NO_CACHE + NO_TRACING + AUTH + ADMIN.format("{store}") + 'listen = "127.0.0.1:9"\n',
    ),
    "auth-stored-key": (
        "auth.mode = keys, the key made in the key store (found in its in-memory index)",
        NO_CACHE + NO_TRACING + '[auth]\nmode = "keys"\n' + ADMIN.format("{store}"),
    ),
    "auth-rpm": (
        "core with auth and an rpm + tpm limit counted in the process",
        NO_CACHE + NO_TRACING + AUTH + "rpm = 100000000\ntpm = 100000000000\n",
    ),
    "ui": (
        "core with the live view on and nobody watching",
        NO_CACHE + NO_TRACING + "[ui]\nenabled = true\n",
    ),
    "mcp-servers": (
        "core with two [[mcp_servers]] configured (/mcp endpoints): the model calls' cost of MCP",
        NO_CACHE + NO_TRACING + MCP_SERVERS,
    ),
    "tracing": (
        "core with every request traced (spans built, encoded, queued)",
        NO_CACHE + DEAD_OTLP,
    ),
    "tracing-live": (
        "core with every request traced to a live OTLP sink (built, encoded, queued, sent)",
        NO_CACHE + LIVE_OTLP,
    ),
    "tracing-live-process": (
        "tracing-live with export_in = process: the common request recorded here, its spans "
        "built and exported by another process",
        NO_CACHE + LIVE_OTLP + 'export_in = "process"\n',
    ),
    "telemetry": (
        "core with tracing to a live sink, the sampled access log and the live view",
        NO_CACHE + TELEMETRY,
    ),
    "cache-memory-miss": (
        "memory cache, a unique prompt every request (misses + stores)",
        MEMORY_CACHE + NO_TRACING,
    ),
    "everything": (
        "overhead.py's everything: cache-memory-miss + telemetry (tracing live, log, view)",
        MEMORY_CACHE + TELEMETRY,
    ),
    "everything-process": (
        "everything with export_in = process",
        MEMORY_CACHE + TELEMETRY.replace(LIVE_OTLP, LIVE_OTLP + 'export_in = "process"\n'),
    ),
    "cache-memory-hit": (
        "memory cache, the same body every request (hits)",
        '[cache]\nbackend = "memory"\nmode = "all"\n' + NO_TRACING,
    ),
    "prices": (
        "core with [[prices]]: each request's cost worked out (metrics, log, spans read it)",
        NO_CACHE + NO_TRACING + PRICES,
    ),
    "budget-memory": (
        "auth-keys with a key and a tenant budget, in the process: reserve, price, settle",
        NO_CACHE + NO_TRACING + BUDGETS,
    ),
    "two-backends": (
        "core over two backends (ordered): the baseline of the fleet variants",
        FLEET + NO_CACHE + NO_TRACING,
    ),
    "affinity-prefix": (
        "two-backends with least_loaded + prefix affinity: key, rendezvous, order (load unknown)",
        FLEET + LEAST_LOADED_PREFIX + NO_CACHE + NO_TRACING,
    ),
    "fleet-scraped": (
        "affinity-prefix over two capacity mocks scraped in process (the mock's slot included)",
        SCRAPED + LEAST_LOADED_PREFIX + NO_CACHE + NO_TRACING,
    ),
    "budget-redis": (
        "budget-memory through Redis: one script before the upstream call, one at the end",
        NO_CACHE
        + NO_TRACING
        + BUDGETS.replace(
            '[auth]\nmode = "keys"\n',
            '[auth]\nmode = "keys"\ntimeout_ms = 1000\nredis_url = "' + REDIS_URL + '"\n',
        ),
    ),
}

BODY = orjson.dumps(
    {
        "model": "gpt-4o-mini",
        "temperature": 0,
        "max_tokens": 8,
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Say hello in one short sentence."},
        ],
    }
)


def scope(body: bytes = BODY) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8080"),
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer " + KEY),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }


def unique_body(n: int) -> bytes:
    """``BODY`` with a prompt of its own (a cache miss)."""
    return BODY.replace(b"one short sentence.", b"one short sentence (%d)." % n)


async def one(app: Gateway, body: bytes = BODY) -> int:
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # never: the request is answered before
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope(body), receive, send)
    return status


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.02)


@contextlib.contextmanager
def otlp_sink() -> Iterator[int]:
    """``loadtests/otlp_sink.py`` on a free loopback port (counting bytes, not decoding)."""
    port = _free_port()
    sink = str(Path(__file__).with_name("otlp_sink.py"))
    proc = subprocess.Popen(
        [sys.executable, sink, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc, "otlp_sink.py")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def redis_server() -> Iterator[int]:
    """A redis-server of this run's own on a free loopback port (no persistence)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    proc = subprocess.Popen([*args, "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


class Helpers:
    """The processes variants need (an OTLP sink, a redis-server), started on first use."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._ports: dict[str, int] = {}

    def toml(self, toml: str) -> str:
        for url, start in ((OTLP_URL, otlp_sink), (REDIS_URL, redis_server)):
            if url in toml:
                if url not in self._ports:
                    self._ports[url] = self._stack.enter_context(start())
                toml = toml.replace(url, url.format(port=self._ports[url]))
        return toml


def helper_cpu_s(app: Gateway) -> float:
    """CPU seconds of the processes the app started for itself (the span exporter process of
    ``export_in = "process"``): moving work to another process is not a saving by itself."""
    tracing = app.tracing
    queue = tracing.queue if tracing is not None else None
    proc = getattr(queue, "process", None)
    if proc is None:
        return 0.0
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


CLK_TCK = os.sysconf("SC_CLK_TCK")


async def measure(
    names: list[str], requests: int, rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Best CPU µs per request of each variant, in this process and in all the gateway's
    processes; the variants take turns round by round, so a neighbour's burst or a drift of the
    machine touches them all alike."""
    best = dict.fromkeys(names, float("inf"))
    best_all = dict.fromkeys(names, float("inf"))
    counter = itertools.count()
    with contextlib.ExitStack() as processes:
        helpers = Helpers(processes)
        async with contextlib.AsyncExitStack() as stack:
            apps = {}
            for name in names:
                toml = helpers.toml(VARIANTS[name][1])
                if "[logging]" not in toml:
                    toml += LOG_OFF
                if "[ui]" not in toml:
                    toml += UI_OFF
                base = "" if "[[backends]]" in toml else BASE  # the fleet variants bring theirs
                if "{store}" in toml:
                    toml = toml.replace("{store}", await _key_store_with_the_bench_key())
                app = Gateway(load_config(text=base + toml, env={}))
                await stack.enter_async_context(app.running())
                for _ in range(200):  # warm-up: caches, the first (cold) request
                    body = unique_body(next(counter)) if name in UNIQUE else BODY
                    assert await one(app, body) == 200
                apps[name] = app
            gc.collect()
            gc.freeze()  # as `gateway serve` does once started: the heap walks stay small
            for _ in range(rounds):
                for name, app in apps.items():
                    # the prompts are made before the clock starts (the same for every variant)
                    bodies = [BODY] * requests
                    if name in UNIQUE:
                        bodies = [unique_body(next(counter)) for _ in range(requests)]
                    cpu, helper = time.process_time(), helper_cpu_s(app)
                    for body in bodies:
                        await one(app, body)
                    await asyncio.sleep(0.3)  # the exporter's share of these requests
                    own = time.process_time() - cpu
                    best[name] = min(best[name], own / requests * 1e6)
                    both = own + helper_cpu_s(app) - helper
                    best_all[name] = min(best_all[name], both / requests * 1e6)
    return best, best_all


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--variant", action="append", choices=list(VARIANTS))
    p.add_argument("--list", action="store_true")
    args = p.parse_args(argv)
    if args.list:
        for name, (desc, _) in VARIANTS.items():
            print(f"{name:<20} {desc}")
        return 0
    names = args.variant or list(VARIANTS)
    if "core" not in names:
        names = ["core", *names]
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        pass
    # which tree runs: PYTHONPATH=<another checkout> measures that one (a before/after)
    print(f"measuring {', '.join(names)} with {gateway.__file__} ...", file=sys.stderr)
    results, all_processes = asyncio.run(measure(names, args.requests, args.rounds))
    core = results["core"]
    print(f"## Feature cost in-process ({args.requests} requests x best of {args.rounds} rounds)\n")
    print("| variant | CPU µs / request | vs core | all processes µs / request | |")
    print("|---|---:|---:|---:|---|")
    for name in names:
        us = results[name]
        diff = "—" if name == "core" else f"{us - core:+.1f} µs ({(us - core) / core:+.1%})"
        print(f"| {name} | {us:.1f} | {diff} | {all_processes[name]:.1f} | {VARIANTS[name][0]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
