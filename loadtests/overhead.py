"""Gateway overhead benchmark: wrk -> nginx directly versus wrk -> gateway -> nginx (SPEC §15).

    python loadtests/overhead.py [--duration 10] [--variant NAME ...] [--cores GW,LOAD]
                                 [--connections 32] [--repeat 1] [--list]

The upstream is nginx answering every request with ``return 200`` and a fixed ``chat.completion``
body, and the load client is wrk (Lua scripts in ``loadtests/wrk/``): neither is Python, so the
numbers measure the gateway rather than the harness. The gateway runs pinned to one core
(``taskset``); nginx, wrk and any helper (OTLP sink, redis-server) share the other one.

For every target (``direct`` = wrk straight to nginx, then each selected gateway *variant*) it
prints requests/s at ``--connections`` (32) and latency percentiles at concurrency 1, plus the
p50 the gateway adds over direct and each variant's throughput relative to ``core``. Variants are
entries in :data:`VARIANTS`: extra TOML for the gateway config plus the wrk script to drive it.

Everything it starts (nginx, gateways, sink, redis) is stopped by its own PID in ``finally``;
temp files live in one temp dir that is removed at the end. All traffic stays on 127.0.0.1.
Exit status: 0 ok, 1 a run failed (or saw errors), 2 missing tools / bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import typing
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WRK_DIR = HERE / "wrk"
OTLP_SINK = HERE / "otlp_sink.py"

WARMUP_S = 2
IDLE_PROBE_S = 1.0
LATENCY_CONNECTIONS = 1
#: the truth check: reported overhead p50 within this of the added p50 at c=1
TRUTH_TOLERANCE_MS = 0.1
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0

# What nginx answers to every request: a small but realistic non-streaming chat completion.
UPSTREAM_BODY = (
    '{"id":"chatcmpl-bench0000000000000000000000","object":"chat.completion",'
    '"created":1733140800,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_bench",'
    '"choices":[{"index":0,"message":{"role":"assistant",'
    '"content":"Hello! How can I help you today?","refusal":null},'
    '"logprobs":null,"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":24,"completion_tokens":9,"total_tokens":33,'
    '"prompt_tokens_details":{"cached_tokens":0},'
    '"completion_tokens_details":{"reasoning_tokens":0}}}'
)

#: with ``Bench.start_nginx(streams=True)``: a request body this long or longer is answered as a
#: stream (UPSTREAM_SSE); every benchmark request is far shorter
STREAM_BODY_BYTES = 10_000
_CHUNK = (
    '{"id":"chatcmpl-bench0000000000000000000000","object":"chat.completion.chunk",'
    '"created":1733140800,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_bench",'
    '"choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}'
)
# The same answer as UPSTREAM_BODY, as a chat.completion.chunk stream ending in [DONE].
UPSTREAM_SSE = (
    "".join(
        f"data: {_CHUNK % (delta, finish)}\n\n"
        for delta, finish in (
            ('{"role":"assistant","content":"Hello!"}', "null"),
            ('{"content":" How can I help you today?"}', "null"),
            ("{}", '"stop"'),
        )
    )
    + "data: [DONE]\n\n"
)


def _nginx_literal(text: str) -> str:
    """``text`` as the inside of a single-quoted nginx string (newlines as ``\\n``)."""
    out = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    assert "$" not in out  # nginx would expand it as a variable
    return out


#: the head of every nginx.conf the benchmarks write (here and loadtests/h2.py): one worker,
#: every file under ``{root}``, keep-alive without end; :func:`nginx_conf` completes its ``http``
NGINX_HEAD = """\
daemon off;
master_process on;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/logs/error.log warn;
events {{ worker_connections 4096; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
"""


def nginx_conf(root: Path, http: str) -> str:
    """:data:`NGINX_HEAD` for ``root``, then ``http`` (the rest of the http block: server
    blocks and directives, indented here) and the block's end."""
    return NGINX_HEAD.format(root=root) + textwrap.indent(http, "    ") + "}\n"


def _nginx_stream_branch() -> tuple[str, str, str]:
    """The map, the ``if`` and the location that answer a long body with UPSTREAM_SSE,
    indented for start_nginx's config (its dedent needs them at least as deep as the rest)."""
    digits = len(str(STREAM_BODY_BYTES))
    sse_map = (
        "\n                    map $content_length $bench_sse {"
        f' "~^[0-9]{{{digits},}}$" 1; default 0; }}'
    )
    sse_if = "\n                            if ($bench_sse) { rewrite ^ /__bench_sse last; }"
    sse_location = (
        "\n                        location = /__bench_sse {"
        "\n                            internal;"
        "\n                            default_type text/event-stream;"
        f"\n                            return 200 '{_nginx_literal(UPSTREAM_SSE)}';"
        "\n                        }"
    )
    return sse_map, sse_if, sse_location


# ---------------------------------------------------------------- variants


@dataclass(frozen=True)
class Variant:
    """One gateway configuration to measure.

    ``toml`` is appended to the base config (one backend -> nginx, a catch-all route, access log
    off). Placeholders start what they name: ``{otlp_endpoint}`` a fresh OTLP/HTTP sink for that
    variant (``loadtests/otlp_sink.py``), ``{redis_url}`` a private ``redis-server`` (one per
    run, flushed before each variant), ``{dead_endpoint}`` a closed port. ``lua`` is the wrk
    script in ``loadtests/wrk/``.
    """

    description: str
    toml: str
    lua: str = "chat.lua"
    #: "wrk" (req/s + latency against nginx), "streams" (the paced SSE upstream, TTFT and
    #: inter-event gaps) or "rss" (memory after 10k and 100k requests)
    kind: str = "wrk"
    #: gateway worker processes; > 1 runs the gateway on every usable core (not pinned to one)
    workers: int = 1

    @property
    def needs(self) -> set[str]:
        return set(re.findall(r"\{(\w+)\}", self.toml))


_NO_TRACING = '[tracing]\nexporter = "none"\n'
_NO_CACHE = '[cache]\nbackend = "off"\n'
_EVERYTHING = (
    '[cache]\nbackend = "memory"\nmode = "all"\n'
    + '[tracing]\nexporter = "otlp"\nendpoint = "{otlp_endpoint}"\n'
    + 'protocol = "http/protobuf"\nsample_ratio = 1.0\n'
    + '[logging]\naccess_log = "sampled"\nslow_ms = 500\nsample_ratio = 0.01\n'
    + "[ui]\nenabled = true\n"
)
#: the streams rows: events per stream and the upstream's pace, concurrent streams, and the
#: sequential streams TTFT is measured over
STREAM_EVENTS = 500
STREAM_RATE = 100.0
STREAM_CONCURRENCY = 100
TTFT_STREAMS = 300
#: the rss rows: RSS is read after this many requests, then after the second figure in all
RSS_FIRST = 10_000
RSS_TOTAL = 100_000
STREAMS_PY = HERE / "streams.py"

#: the key wrk sends (loadtests/wrk/*.lua), as an [auth] entry; rpm far beyond any run's rate
_AUTH = (
    '[auth]\nmode = "keys"\n{extra}[[auth.keys]]\ntenant = "bench"\n'
    f'sha256 = "{hashlib.sha256(b"sk-bench").hexdigest()}"\n{{limits}}'
)

VARIANTS: dict[str, Variant] = {
    "core": Variant(
        "proxy only: cache off, tracing off (the baseline)",
        _NO_CACHE + _NO_TRACING,
    ),
    "tracing-otlp": Variant(
        "every request traced and exported over OTLP/HTTP to a local sink",
        _NO_CACHE
        + '[tracing]\nexporter = "otlp"\nendpoint = "{otlp_endpoint}"\n'
        + 'protocol = "http/protobuf"\nsample_ratio = 1.0\n',
    ),
    "tracing-otlp-process": Variant(
        "tracing-otlp with export_in = process (spans exported by a process of their own; "
        "its CPU counted with the gateway's)",
        _NO_CACHE
        + '[tracing]\nexporter = "otlp"\nendpoint = "{otlp_endpoint}"\n'
        + 'protocol = "http/protobuf"\nsample_ratio = 1.0\nexport_in = "process"\n',
    ),
    "tracing-collector-down": Variant(
        "every request traced; the OTLP endpoint is a closed port",
        _NO_CACHE
        + '[tracing]\nexporter = "otlp"\nendpoint = "{dead_endpoint}"\n'
        + 'protocol = "http/protobuf"\nsample_ratio = 1.0\n',
    ),
    "cache-memory-hit": Variant(
        "in-process cache, the same body every request (hits)",
        '[cache]\nbackend = "memory"\nmode = "all"\n' + _NO_TRACING,
    ),
    "cache-memory-miss": Variant(
        "in-process cache, a unique prompt every request (misses + stores)",
        '[cache]\nbackend = "memory"\nmode = "all"\n' + _NO_TRACING,
        lua="chat_unique.lua",
    ),
    "cache-redis-hit": Variant(
        "Redis cache on the load core, the same body every request (hits)",
        '[cache]\nbackend = "redis"\nurl = "{redis_url}"\nmode = "all"\n' + _NO_TRACING,
    ),
    "cache-redis-miss": Variant(
        "Redis cache on the load core, a unique prompt every request (misses + stores)",
        '[cache]\nbackend = "redis"\nurl = "{redis_url}"\nmode = "all"\n' + _NO_TRACING,
        lua="chat_unique.lua",
    ),
    "metrics-off": Variant(
        "core with [metrics] enabled = false (what /metrics costs: core versus this)",
        _NO_CACHE + _NO_TRACING + "[metrics]\nenabled = false\n",
    ),
    "observability": Variant(
        "core plus the sampled JSON access log (metrics on, as in core)",
        _NO_CACHE
        + _NO_TRACING
        + '[logging]\naccess_log = "sampled"\nslow_ms = 500\nsample_ratio = 0.01\n',
    ),
    "auth-keys": Variant(
        "core with auth.mode = keys (sha256 lookup, tenant), no limits",
        _NO_CACHE + _NO_TRACING + _AUTH.format(extra="", limits=""),
    ),
    "auth-rpm-memory": Variant(
        "core with auth and an rpm limit counted in the process (one GCRA step per request)",
        _NO_CACHE + _NO_TRACING + _AUTH.format(extra="", limits="rpm = 100000000\n"),
    ),
    "auth-rpm-redis": Variant(
        "core with auth and an rpm limit in Redis on the load core (one Lua call per request)",
        _NO_CACHE
        + _NO_TRACING
        + _AUTH.format(extra='redis_url = "{redis_url}"\n', limits="rpm = 100000000\n"),
    ),
    "ui": Variant(
        "core with the live view on and nobody watching (one ring-buffer append per request)",
        _NO_CACHE + _NO_TRACING + "[ui]\nenabled = true\n",
    ),
    "everything": Variant(
        "tracing otlp ratio 1.0 to a live sink, metrics, sampled access log, memory cache "
        "missing (unique prompts), live view on",
        _EVERYTHING,
        lua="chat_unique.lua",
    ),
    "everything-process": Variant(
        "everything with export_in = process (the exporter process's CPU counted with the "
        "gateway's)",
        _EVERYTHING.replace(
            "sample_ratio = 1.0\n", 'sample_ratio = 1.0\nexport_in = "process"\n', 1
        ),
        lua="chat_unique.lua",
    ),
    "workers-2": Variant(
        "core with [server] workers = 2, the gateway on both cores (shared with the load side)",
        _NO_CACHE + _NO_TRACING,
        workers=2,
    ),
    "streams": Variant(
        "a paced SSE upstream: TTFT at c=1 (added, and reported vs seen), then 100 concurrent "
        f"streams of {STREAM_EVENTS} events at {STREAM_RATE:g} events/s (inter-event gap added)",
        _NO_CACHE + _NO_TRACING + '[logging]\naccess_log = "all"\n',
        kind="streams",
    ),
    "rss": Variant(
        "core: the gateway's RSS after 10k and after 100k requests (c=32)",
        _NO_CACHE + _NO_TRACING,
        kind="rss",
    ),
    "rss-everything": Variant(
        "everything: the gateway's RSS after 10k and after 100k requests (c=32)",
        _EVERYTHING,
        lua="chat_unique.lua",
        kind="rss",
    ),
}
DEFAULT_VARIANTS = ("core",)
BASELINE = "core"


def base_toml(upstream_port: int) -> str:
    return textwrap.dedent(
        f"""\
        # generated by loadtests/overhead.py
        [server]
        host = "127.0.0.1"
        shutdown_grace_s = 2

        [[backends]]
        name = "nginx"
        url = "http://127.0.0.1:{upstream_port}/v1"

        [[routes]]
        name = "all"
        models = ["*"]
        backends = ["nginx"]

        [logging]
        access_log = "off"

        """
    )


# ---------------------------------------------------------------- wrk scripts

#: appended to the c=1 latency script: every response's ``Server-Timing: gateway;dur=`` (the
#: gateway's own overhead figure) is kept, and the p50 of those printed at the end, so the
#: truth column compares the gateway's word with wrk's clock over the very same requests
TRUTH_LUA = """
-- overhead.py truth column: Server-Timing gateway;dur of every timed response
local truth_threads = {}
local truth_base_setup = setup
function setup(thread)
  if truth_base_setup then truth_base_setup(thread) end
  table.insert(truth_threads, thread)
end
truth = {}
local truth_base_response = response
function response(status, headers, body)
  if truth_base_response then truth_base_response(status, headers, body) end
  local st = headers["server-timing"] or headers["Server-Timing"]
  if st then
    local g = string.match(st, "gateway;dur=([0-9.]+)")
    if g then truth[#truth + 1] = tonumber(g) end
  end
end
function done(summary, latency, requests)
  local all = {}
  for _, t in ipairs(truth_threads) do
    for _, v in ipairs(t:get("truth")) do all[#all + 1] = v end
  end
  table.sort(all)
  if #all > 0 then
    io.write(string.format("TRUTH n=%d p50=%.4f\\n", #all, all[math.floor(#all / 2) + 1]))
  else
    io.write("TRUTH n=0\\n")
  end
end
"""

#: appended for the rss rows: the thread stops after the request count in the 2nd argument
COUNT_LUA = """
-- overhead.py rss rows: stop after args[2] responses
local count_limit = 0
local count_base_init = init
function init(args)
  if count_base_init then count_base_init(args) end
  count_limit = tonumber(args[2]) or 0
end
local count_n = 0
local count_base_response = response
function response(status, headers, body)
  if count_base_response then count_base_response(status, headers, body) end
  count_n = count_n + 1
  if count_limit > 0 and count_n >= count_limit then wrk.thread:stop() end
end
"""


def parse_truth(out: str) -> tuple[int, float | None]:
    """``TRUTH n=1234 p50=0.1234`` (TRUTH_LUA's line) -> (1234, 0.1234)."""
    m = re.search(r"^TRUTH n=(\d+)(?: p50=([0-9.]+))?", out, re.M)
    if not m:
        return 0, None
    return int(m.group(1)), float(m.group(2)) if m.group(2) else None


# ---------------------------------------------------------------- wrk output


@dataclass
class WrkResult:
    rps: float = 0.0
    requests: int = 0
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    non_2xx: int = 0
    socket_errors: dict[str, int] = field(default_factory=dict)
    raw: str = ""

    @property
    def errors(self) -> int:
        return self.non_2xx + sum(self.socket_errors.values())


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def parse_duration_ms(text: str) -> float:
    """``"812.00us"`` -> 0.812, ``"1.20ms"`` -> 1.2, ``"2.00s"`` -> 2000.0."""
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text.strip())
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNIT_MS[m.group(2)]


def parse_wrk(out: str) -> WrkResult:
    """Parse wrk's text summary (``--latency`` adds the percentile table)."""
    r = WrkResult(raw=out)
    m = re.search(r"^Requests/sec:\s+([0-9.]+)", out, re.M)
    if not m:
        raise ValueError("wrk printed no Requests/sec line")
    r.rps = float(m.group(1))
    m = re.search(r"^\s*(\d+) requests in", out, re.M)
    if m:
        r.requests = int(m.group(1))
    for pct, attr in (("50", "p50_ms"), ("90", "p90_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s+{pct}%\s+([0-9.]+(?:us|ms|s|m|h))\s*$", out, re.M)
        if m:
            setattr(r, attr, parse_duration_ms(m.group(1)))
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if m:
        r.non_2xx = int(m.group(1))
    m = re.search(r"Socket errors:\s+(.*)$", out, re.M)
    if m:
        for kind, n in re.findall(r"(\w+) (\d+)", m.group(1)):
            if int(n):
                r.socket_errors[kind] = int(n)
    return r


@dataclass
class Measurement:
    """One target: wrk at -c32 (throughput) and -c1 (latency), plus CPU accounting."""

    thr: WrkResult = field(default_factory=WrkResult)
    lat: WrkResult = field(default_factory=WrkResult)
    #: per-CPU busy % in the second before the warm-up, with everything of ours idle
    idle_busy: dict[int, float] = field(default_factory=dict)
    #: per-CPU busy % and steal % during the -c32 run
    run_busy: dict[int, float] = field(default_factory=dict)
    run_steal: dict[int, float] = field(default_factory=dict)
    #: the gateway process's CPU during the -c32 run: % of one core, and per request
    gw_cpu_pct: float | None = None
    gw_cpu_us: float | None = None
    #: the gateway's own overhead p50 at c=1, from ``Server-Timing: gateway;dur=`` of the very
    #: requests wrk timed (the truth column), and how many responses carried it
    reported_p50_ms: float | None = None
    reported_n: int = 0
    #: the streams and rss rows' figures, as the table's last column shows them
    extra: str = ""
    #: anything else worth printing under the table (e.g. what the OTLP sink received)
    notes: list[str] = field(default_factory=list)
    #: every round (with --repeat), for error counts and the spread
    all_thr: list[WrkResult] = field(default_factory=list)
    all_lat: list[WrkResult] = field(default_factory=list)


# ---------------------------------------------------------------- CPU accounting

CpuTimes = dict[int, tuple[int, int, int]]  # cpu -> (busy, steal, total) in clock ticks
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_times() -> CpuTimes:
    """Per-CPU counters from /proc/stat (empty where there is no /proc)."""
    out: CpuTimes = {}
    try:
        text = Path("/proc/stat").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        m = re.match(r"cpu(\d+)\s+(.*)", line)
        if not m:
            continue
        v = [int(x) for x in m.group(2).split()[:8]] + [0] * 8
        user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
        busy = user + nice + system + irq + softirq
        out[int(m.group(1))] = (busy, steal, busy + steal + idle + iowait)
    return out


def busy_pct(before: CpuTimes, after: CpuTimes) -> tuple[dict[int, float], dict[int, float]]:
    busy: dict[int, float] = {}
    steal: dict[int, float] = {}
    for cpu, (b1, s1, t1) in after.items():
        b0, s0, t0 = before.get(cpu, (b1, s1, t1))
        if t1 > t0:
            busy[cpu] = 100.0 * (b1 - b0) / (t1 - t0)
            steal[cpu] = 100.0 * (s1 - s0) / (t1 - t0)
    return busy, steal


def cpu_wall_s(before: CpuTimes, after: CpuTimes) -> float:
    """Elapsed seconds between two samples, from one CPU's total ticks."""
    for cpu, (_, _, t1) in after.items():
        if cpu in before:
            return (t1 - before[cpu][2]) / CLK_TCK
    return 0.0


def proc_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process and its children (``/proc/PID/stat`` utime +
    stime; with ``workers > 1`` the workers are the supervisor's children)."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / CLK_TCK
    for child in child_pids(pid):
        total += proc_cpu_s(child) or 0.0
    return total


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def rss_mb(pid: int) -> float | None:
    """Resident memory of one process (``VmRSS``), MB."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 1024 if m else None


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Pinning:
    """Which cores the gateway and the load side run on (None = unpinned)."""

    def __init__(self, gw: int | None, load: int | None) -> None:
        self.gw, self.load = gw, load

    def gateway(self, argv: list[str], workers: int = 1) -> list[str]:
        if workers > 1 and self.gw is not None:  # every usable core (shared with the load side)
            cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
            return ["taskset", "-c", cores, *argv]
        return self._wrap(self.gw, argv)

    def loader(self, argv: list[str]) -> list[str]:
        return self._wrap(self.load, argv)

    @staticmethod
    def _wrap(core: int | None, argv: list[str]) -> list[str]:
        return argv if core is None else ["taskset", "-c", str(core), *argv]

    def describe(self) -> str:
        if self.gw is None:
            return "unpinned (gateway, nginx and wrk share every CPU)"
        return f"gateway on CPU {self.gw}; nginx, wrk and helpers on CPU {self.load}"


class Procs:
    """Processes this script started; stopped by their own PID, newest first."""

    def __init__(self) -> None:
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self,
        name: str,
        argv: list[str],
        log: Path,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,  # Ctrl-C reaches only us; we stop them in order
            )
        self._procs.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int | None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)
        self._procs = [(n, p) for n, p in self._procs if p is not proc]
        return proc.returncode

    def stop_all(self) -> None:
        for _, proc in reversed(list(self._procs)):
            self.stop(proc)


def wait_until(
    check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, log: Path
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}\n{tail(log)}")
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {START_TIMEOUT_S:.0f}s\n{tail(log)}")


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text("utf-8", errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return textwrap.indent("\n".join(text), "    | ")


def http(
    method: str, url: str, body: bytes | None = None, timeout: float = 2.0
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer sk-bench")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


PROBE_BODY = (
    b'{"model":"gpt-4o-mini","temperature":0,'
    b'"messages":[{"role":"user","content":"overhead.py probe"}]}'
)


# ---------------------------------------------------------------- the bench


class Bench:
    def __init__(self, args: argparse.Namespace, pin: Pinning, tmp: Path) -> None:
        self.args = args
        self.pin = pin
        self.tmp = tmp
        self.procs = Procs()
        self.nginx_port = 0
        self._helpers: dict[str, str] = {}  # template key -> value, filled lazily
        self._direct_streams: tuple[Any, Any] | None = None
        #: seconds of wrk at c=connections before each target's measurement
        self.warmup_s: float = WARMUP_S

    # -- helpers ----------------------------------------------------------

    def start_nginx(self, streams: bool = False) -> None:
        """nginx answering UPSTREAM_BODY; with ``streams``, a request body of STREAM_BODY_BYTES
        or more (no benchmark request is that long) is answered with UPSTREAM_SSE instead, so a
        proxy's streaming can be checked against the very upstream it is measured with."""
        root = self.tmp / "nginx"
        for sub in ("logs", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.nginx_port = free_port()
        body = UPSTREAM_BODY.replace("\\", "\\\\").replace("'", "\\'")
        assert "$" not in body  # nginx would expand it as a variable
        sse_map, sse_if, sse_location = _nginx_stream_branch() if streams else ("", "", "")
        conf = root / "nginx.conf"
        conf.write_text(
            nginx_conf(
                root,
                textwrap.dedent(
                    f"""\
                    client_body_buffer_size 64k;
                    server_tokens off;{sse_map}
                    server {{
                        listen 127.0.0.1:{self.nginx_port} backlog=4096;
                        default_type application/json;
                        location / {{{sse_if}
                            return 200 '{body}';
                        }}{sse_location}
                    }}
                    """
                ),
            )
        )
        log = root / "logs" / "stdout.log"
        nginx = find_tool("nginx") or "nginx"
        argv = [nginx, "-p", str(root), "-e", str(root / "logs" / "error.log"), "-c", str(conf)]
        proc = self.procs.start("nginx", self.pin.loader(argv), log)
        url = f"http://127.0.0.1:{self.nginx_port}/v1/chat/completions"
        wait_until(lambda: http("POST", url, PROBE_BODY)[0] == 200, proc, "nginx", log)

    def helper(self, key: str) -> str:
        """Value for a TOML placeholder; Redis is shared by the variants (flushed per variant)."""
        if key not in self._helpers:
            if key == "redis_url":
                self._helpers[key] = self._start_redis()
            elif key == "dead_endpoint":
                self._helpers[key] = f"http://127.0.0.1:{free_port()}"  # nobody listens there
            else:
                raise ValueError(f"unknown placeholder {{{key}}} in a variant's TOML")
        return self._helpers[key]

    def _start_sink(self, name: str) -> tuple[subprocess.Popen[bytes], str, Path]:
        """A fresh OTLP/HTTP sink per variant, so its totals are that variant's."""
        port = free_port()
        log = self.tmp / f"otlp_sink-{name}.log"
        argv = [sys.executable, str(OTLP_SINK), "--port", str(port)]
        proc = self.procs.start("otlp_sink", self.pin.loader(argv), log, cwd=REPO)
        wait_until(lambda: port_open(port), proc, "otlp_sink.py", log)
        # the SPEC's endpoint is the OTLP base URL (like OTEL_EXPORTER_OTLP_ENDPOINT);
        # the exporter posts to <endpoint>/v1/traces, the one path the sink serves
        return proc, f"http://127.0.0.1:{port}", log

    def _stop_sink(self, proc: subprocess.Popen[bytes], log: Path) -> str:
        self.procs.stop(proc)
        for line in reversed(log.read_text("utf-8", errors="replace").splitlines()):
            if line.startswith("{"):
                try:
                    t = json.loads(line)
                except ValueError:
                    break
                return (
                    f"otlp sink received {t.get('requests', 0)} export requests, "
                    f"{t.get('bytes', 0) / 1e6:.2f} MB, {t.get('errors', 0)} errors"
                )
        return "otlp sink printed no totals"

    def _start_redis(self) -> str:
        port = free_port()
        log = self.tmp / "redis.log"
        rdir = self.tmp / "redis"
        rdir.mkdir(exist_ok=True)
        argv = [
            find_tool("redis-server") or "redis-server",
            "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", str(rdir),
        ]  # fmt: skip
        proc = self.procs.start("redis", self.pin.loader(argv), log)
        wait_until(lambda: redis_ping(port), proc, "redis-server", log)
        return f"redis://127.0.0.1:{port}/0"

    def skip_reason(self, name: str) -> str | None:
        v = VARIANTS[name]
        if "otlp_endpoint" in v.needs and not OTLP_SINK.exists():
            return f"{OTLP_SINK.relative_to(REPO)} does not exist (yet)"
        if "redis_url" in v.needs and not find_tool("redis-server"):
            return "redis-server not found (Debian package redis-server)"
        return None

    # -- wrk --------------------------------------------------------------

    def script(self, lua: str, snippet: str = "") -> Path:
        """The wrk script ``lua`` from ``loadtests/wrk/``, with ``snippet`` appended (a copy in
        the temp dir; the snippet wraps the script's own callbacks rather than replacing them)."""
        if not snippet:
            return WRK_DIR / lua
        path = self.tmp / f"{Path(lua).stem}-{abs(hash(snippet)) % 10**8}.lua"
        if not path.exists():
            path.write_text((WRK_DIR / lua).read_text() + "\n" + snippet)
        return path

    def wrk(
        self,
        port: int,
        lua: str,
        connections: int,
        duration: float,
        latency: bool,
        snippet: str = "",
        args: Sequence[str] = (),
    ) -> str:
        argv = [
            "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s", "--timeout", "10s",
            "-s", str(self.script(lua, snippet)),
        ]  # fmt: skip
        if latency:
            argv.append("--latency")
        # run id for chat_unique, then the snippet's arguments
        argv += [f"http://127.0.0.1:{port}", "--", uuid.uuid4().hex, *args]
        res = subprocess.run(
            self.pin.loader(argv),
            capture_output=True,
            text=True,
            timeout=duration + 60,
            check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(f"wrk failed ({res.returncode}): {res.stderr.strip()}")
        return res.stdout

    def measure(self, port: int, lua: str, gw_pid: int | None = None) -> Measurement:
        """Idle probe, warm-up, then ``--repeat`` rounds of c=32 and c=1; the best round wins.

        Other load on the machine only ever makes a round slower, so with ``--repeat`` > 1 the
        table shows the highest req/s and the lowest p50 seen (and the notes show the spread).
        """
        m = Measurement()
        t0 = cpu_times()
        time.sleep(IDLE_PROBE_S)  # everything is idle now: is anybody else using our cores?
        m.idle_busy, _ = busy_pct(t0, cpu_times())
        self.wrk(port, lua, self.args.connections, self.warmup_s, latency=False)
        best_rps = -1.0
        for _ in range(self.args.repeat):
            t0, g0 = cpu_times(), proc_cpu_s(gw_pid)
            thr = parse_wrk(self.wrk(port, lua, self.args.connections, self.args.duration, False))
            t1, g1 = cpu_times(), proc_cpu_s(gw_pid)
            m.all_thr.append(thr)
            if thr.rps > best_rps:
                best_rps = thr.rps
                m.thr = thr
                m.run_busy, m.run_steal = busy_pct(t0, t1)
                m.gw_cpu_pct = m.gw_cpu_us = None
                if g0 is not None and g1 is not None and thr.requests:
                    wall = cpu_wall_s(t0, t1)
                    m.gw_cpu_pct = 100.0 * (g1 - g0) / wall if wall else None
                    m.gw_cpu_us = 1e6 * (g1 - g0) / thr.requests
            out = self.wrk(port, lua, LATENCY_CONNECTIONS, self.args.duration, True, TRUTH_LUA)
            lat = parse_wrk(out)
            m.all_lat.append(lat)
            if m.lat.p50_ms is None or (lat.p50_ms is not None and lat.p50_ms < m.lat.p50_ms):
                m.lat = lat
                m.reported_n, m.reported_p50_ms = parse_truth(out)
        if self.args.repeat > 1:
            rps = sorted(r.rps for r in m.all_thr)
            p50 = sorted(r.p50_ms for r in m.all_lat if r.p50_ms is not None)
            note = f"{len(rps)} rounds: req/s {rps[0]:,.0f} to {rps[-1]:,.0f}"
            if p50:
                note += f", p50 {p50[0]:.3f} to {p50[-1]:.3f} ms"
            m.notes.append(note + " (best shown)")
        return m

    # -- gateway ----------------------------------------------------------

    def run_variant(
        self, name: str, src: Path | None = None, check: Callable[[int], None] | None = None
    ) -> Measurement:
        """Start the gateway for variant ``name`` (from the source tree ``src``, default this
        one), ``check(port)`` it if given, measure it as its kind says, stop it (and its
        helpers) by PID."""
        v = VARIANTS[name]
        sink: tuple[subprocess.Popen[bytes], str, Path] | None = None
        if "otlp_endpoint" in v.needs:
            sink = self._start_sink(name)
        subst = {k: self.helper(k) for k in sorted(v.needs - {"otlp_endpoint"})}
        if sink:
            subst["otlp_endpoint"] = sink[1]
        if "redis_url" in subst:
            redis_command(subst["redis_url"], b"FLUSHALL")
        upstream = self.streams_port() if v.kind == "streams" else self.nginx_port
        label = name if src is None else f"{name}@{src.name}"
        proc, port, log = self.start_gateway(label, v, upstream_port=upstream, subst=subst, src=src)
        result: Measurement | None = None
        try:
            if check is not None:
                check(port)
            result = self._measure_as(v, port, log, proc.pid)
            if "redis_url" in subst:  # evidence the cache is in the path: 1 key for hits, many else
                reply = redis_command(subst["redis_url"], b"DBSIZE").strip().lstrip(b":")
                result.notes.append(
                    f"redis held {reply.decode(errors='replace')} keys after the run"
                )
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited during the run\n{tail(log)}")
        finally:
            t0 = time.monotonic()
            rc = self.procs.stop(proc)
            stop_s = time.monotonic() - t0
            if rc not in (0, -signal.SIGTERM):
                print(f"note: gateway[{label}] exited with status {rc}", file=sys.stderr)
            if sink:
                note = self._stop_sink(sink[0], sink[2])
                if result:
                    result.notes.append(note)
        assert result is not None
        if stop_s > 5:
            result.notes.append(f"the gateway took {stop_s:.1f}s to stop after SIGTERM")
        return result

    def _measure_as(self, v: Variant, port: int, log: Path, pid: int) -> Measurement:
        if v.kind == "streams":
            return self.measure_streams(port, log)
        if v.kind == "rss":
            return self.measure_rss(port, v.lua, pid)
        return self.measure(port, v.lua, gw_pid=pid)

    def start_gateway(
        self,
        label: str,
        v: Variant,
        upstream_port: int,
        subst: dict[str, str],
        src: Path | None = None,
    ) -> tuple[subprocess.Popen[bytes], int, Path]:
        """Write the variant's config, start ``gateway serve`` pinned, wait for a 200."""
        cfg = self.tmp / f"gateway-{label}.toml"
        base = base_toml(upstream_port)
        if v.workers > 1:
            base = base.replace("[server]\n", f"[server]\nworkers = {v.workers}\n", 1)
        if "[logging]" in v.toml:  # the variant sets its own access log
            base = base.replace('[logging]\naccess_log = "off"\n', "")
        toml = v.toml.format(**subst)
        if "[ui]" not in toml:  # on by default on loopback: a variant measures it only by asking
            toml += "[ui]\nenabled = false\n"
        cfg.write_text(base + toml)
        port = free_port()
        log = self.tmp / f"gateway-{label}.log"
        env = {k: val for k, val in os.environ.items() if not k.startswith("GATEWAY")}
        cwd = REPO
        if src is not None:  # another source tree (e.g. a worktree of an earlier commit)
            cwd = src
            env["PYTHONPATH"] = str(src)
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)]
        argv += ["--port", str(port)]
        proc = self.procs.start(
            f"gateway[{label}]", self.pin.gateway(argv, v.workers), log, cwd=cwd, env=env
        )
        base_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http("GET", base_url + "/healthz")[0] == 200, proc, "gateway", log)
        if v.kind != "streams":
            status, body = http("POST", base_url + "/v1/chat/completions", PROBE_BODY, timeout=10)
            if status != 200:
                raise RuntimeError(
                    f"gateway answered a probe chat completion with {status}: "
                    f"{body[:300].decode(errors='replace')}\n{tail(log)}"
                )
        return proc, port, log

    # -- rss --------------------------------------------------------------

    def measure_rss(self, port: int, lua: str, pid: int) -> Measurement:
        """RSS after RSS_FIRST requests, then after RSS_TOTAL in all (c=32, counted by wrk)."""
        m = Measurement()
        before = rss_mb(pid)
        figures: list[float | None] = []
        done = 0
        for target in (RSS_FIRST, RSS_TOTAL):
            r = parse_wrk(self.wrk_count(port, lua, target - done))
            m.all_thr.append(r)
            done += r.requests
            time.sleep(0.5)  # let the last responses' telemetry settle
            figures.append(rss_mb(pid))
        first, last = figures
        if first is not None and last is not None:
            growth = 100.0 * (last - first) / first
            m.extra = (
                f"RSS {first:.1f} MB after {RSS_FIRST // 1000}k, {last:.1f} MB after "
                f"{done / 1000:.0f}k ({growth:+.1f} %)"
            )
        if before is not None:
            m.notes.append(f"RSS at start {before:.1f} MB")
        return m

    def wrk_count(self, port: int, lua: str, count: int) -> str:
        """wrk at c=connections until ``count`` responses (COUNT_LUA stops its thread there;
        wrk itself sleeps out its duration, so it is sent SIGINT, on which it prints its
        summary and exits, once its CPU time stops moving)."""
        argv = [
            "wrk", "-t1", f"-c{self.args.connections}", "-d600s", "--timeout", "10s",
            "-s", str(self.script(lua, COUNT_LUA)),
            f"http://127.0.0.1:{port}", "--", uuid.uuid4().hex, str(count),
        ]  # fmt: skip
        out = self.tmp / "wrk-count.out"
        with out.open("wb") as fh:
            proc = subprocess.Popen(self.pin.loader(argv), stdout=fh, stderr=subprocess.STDOUT)
        try:
            last = None
            while proc.poll() is None:
                time.sleep(1.0)
                cpu = proc_cpu_s(proc.pid)
                if cpu is not None and cpu == last:
                    proc.send_signal(signal.SIGINT)
                    proc.wait(30)
                last = cpu
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        return out.read_text("utf-8", errors="replace")

    # -- streams ----------------------------------------------------------

    def streams_port(self) -> int:
        """The paced SSE upstream (loadtests/streams.py), started once, on the load core."""
        if "streams_port" not in self._helpers:
            port = free_port()
            log = self.tmp / "streams-upstream.log"
            argv = [sys.executable, str(STREAMS_PY), "upstream", "--port", str(port)]
            argv += ["--rate", str(STREAM_RATE)]
            proc = self.procs.start("streams-upstream", self.pin.loader(argv), log, cwd=REPO)
            wait_until(lambda: port_open(port), proc, "streams.py upstream", log)
            self._helpers["streams_port"] = str(port)
        return int(self._helpers["streams_port"])

    def stream_client(self, port: int, streams: int, concurrency: int, events: int) -> Any:
        argv = [sys.executable, str(STREAMS_PY), "client", "--url", f"http://127.0.0.1:{port}"]
        argv += ["--streams", str(streams), "--concurrency", str(concurrency)]
        argv += ["--events", str(events)]
        res = subprocess.run(
            self.pin.loader(argv), capture_output=True, text=True, timeout=600, check=False
        )
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"streams.py client failed: {res.stderr.strip()[-500:]}")
        result = json.loads(lines[-1])
        if result["errors"]:
            raise RuntimeError(f"streams.py client saw errors: {result}")
        return result

    def direct_streams(self) -> tuple[Any, Any]:
        if self._direct_streams is None:
            port = self.streams_port()
            self._direct_streams = (
                self.stream_client(port, TTFT_STREAMS, 1, 1),
                self.stream_client(port, STREAM_CONCURRENCY, STREAM_CONCURRENCY, STREAM_EVENTS),
            )
        return self._direct_streams

    def measure_streams(self, port: int, log: Path) -> Measurement:
        """TTFT at c=1 (added; and the gateway's reported TTFT from its access log beside the
        client's), then STREAM_CONCURRENCY streams at once: inter-event gaps added."""
        m = Measurement()
        d_ttft, d_gaps = self.direct_streams()
        g_ttft = self.stream_client(port, TTFT_STREAMS, 1, 1)
        reported = reported_ttft_ms(log)
        g_gaps = self.stream_client(port, STREAM_CONCURRENCY, STREAM_CONCURRENCY, STREAM_EVENTS)
        seen = g_ttft["ttft_ms"]["p50"]
        added = seen - d_ttft["ttft_ms"]["p50"]
        gap50 = g_gaps["gap_ms"]["p50"] - d_gaps["gap_ms"]["p50"]
        gap99 = g_gaps["gap_ms"]["p99"] - d_gaps["gap_ms"]["p99"]
        rep = f"{reported:.3f}" if reported is not None else "—"
        m.extra = (
            f"TTFT added {added:+.3f} ms p50 (seen {seen:.3f}, reported {rep}); "
            f"{STREAM_CONCURRENCY} x {STREAM_EVENTS} events @{STREAM_RATE:g}/s: gap added "
            f"{gap50:+.3f}/{gap99:+.3f} ms p50/p99"
        )
        m.notes.append(
            f"direct TTFT p50 {d_ttft['ttft_ms']['p50']:.3f} ms; gaps direct "
            f"{d_gaps['gap_ms']['p50']:.3f}/{d_gaps['gap_ms']['p99']:.3f} ms, through the "
            f"gateway {g_gaps['gap_ms']['p50']:.3f}/{g_gaps['gap_ms']['p99']:.3f} ms p50/p99 "
            f"({g_gaps['gap_count']:,} gaps); the {STREAM_CONCURRENCY} streams took "
            f"{g_gaps['seconds']:.1f} s (direct {d_gaps['seconds']:.1f} s)"
        )
        return m


def reported_ttft_ms(log: Path) -> float | None:
    """p50 of ``ttft_ms`` over the access log lines the gateway has written so far."""
    values = []
    for line in log.read_text("utf-8", errors="replace").splitlines():
        if line.startswith("{") and '"ttft_ms"' in line:
            with contextlib.suppress(ValueError):
                v = json.loads(line).get("ttft_ms")
                if isinstance(v, int | float):
                    values.append(float(v))
    if not values:
        return None
    values.sort()
    return values[len(values) // 2]


def redis_command(url: str, command: bytes) -> bytes:
    """Send one inline command to the Redis at ``url`` and return the first reply bytes."""
    port = urlsplit(url).port or 6379
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(command + b"\r\n")
            return s.recv(64)
    except OSError:
        return b""


def redis_ping(port: int) -> bool:
    return redis_command(f"redis://127.0.0.1:{port}", b"PING").startswith(b"+PONG")


# ---------------------------------------------------------------- report


@dataclass
class Row:
    target: str
    m: Measurement | None = None
    note: str = ""

    @property
    def thr(self) -> WrkResult | None:
        return self.m.thr if self.m else None

    @property
    def lat(self) -> WrkResult | None:
        return self.m.lat if self.m else None


def fmt(x: float | None, nd: int = 3) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def render(rows: Sequence[Row], connections: int) -> str:
    """One table: throughput, latency, the truth column, CPU, and the streams/rss figures."""
    direct = next((r for r in rows if r.target == "direct" and r.lat), None)
    core = next((r for r in rows if r.target == BASELINE and r.thr), None)
    head = [
        "target",
        f"req/s @c{connections}",
        "direct ÷ target",
        "p50 @c1 (ms)",
        "p99 @c1 (ms)",
        "added p50 (ms)",
        "reported p50 (ms)",
        f"vs {BASELINE} (%)",
        f"gw CPU @c{connections} (%)",
        "gw CPU/req (µs)",
        "streams / memory",
        "errors",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cells(r, direct, core, len(head))) + " |")
    return "\n".join(lines)


def _cells(r: Row, direct: Row | None, core: Row | None, width: int) -> list[str]:
    if r.m is None:
        return [r.target, *["—"] * (width - 2), r.note or "skipped"]
    m = r.m
    errs = describe_errors(*m.all_thr, *m.all_lat)
    if not m.thr.rps:  # streams and rss rows: their figures are in the last column but one
        return [r.target, *["—"] * (width - 4), m.extra or "—", errs]
    added = ratio = rel = None
    if direct and direct.m and r.target != "direct":
        if m.lat.p50_ms is not None:
            added = m.lat.p50_ms - (direct.m.lat.p50_ms or 0.0)
        ratio = direct.m.thr.rps / m.thr.rps
    if core and core.thr and r.target != "direct":
        rel = 100.0 * m.thr.rps / core.thr.rps
    return [
        r.target,
        f"{m.thr.rps:,.0f}",
        fmt(ratio, 1),
        fmt(m.lat.p50_ms),
        fmt(m.lat.p99_ms),
        fmt(added),
        fmt(m.reported_p50_ms),
        fmt(rel, 1),
        fmt(m.gw_cpu_pct, 0),
        fmt(m.gw_cpu_us, 0),
        m.extra or "—",
        errs,
    ]


def describe_errors(*results: WrkResult) -> str:
    non2xx = sum(r.non_2xx for r in results)
    sock: dict[str, int] = {}
    for r in results:
        for k, n in r.socket_errors.items():
            sock[k] = sock.get(k, 0) + n
    parts = [f"{non2xx} non-2xx"] if non2xx else []
    parts += [f"{n} {k}" for k, n in sock.items()]
    return ", ".join(parts) if parts else "0"


def ratio_line(rows: Sequence[Row]) -> str:
    direct = next((r for r in rows if r.target == "direct" and r.thr), None)
    gws = [r for r in rows if r.target != "direct" and r.thr]
    gw = next((r for r in gws if r.target == BASELINE), gws[0] if gws else None)
    if not direct or not direct.thr or not gw or not gw.thr or not gw.thr.rps:
        return "direct/gateway throughput ratio: n/a"
    ratio = direct.thr.rps / gw.thr.rps
    verdict = (
        "ok (>= 5x): the upstream is not the bottleneck"
        if ratio >= 5
        else "below 5x: the upstream/load side may be the bottleneck, gateway figures are a floor"
    )
    return f"direct/gateway throughput ratio ({gw.target}): {ratio:.1f}x — {verdict}"


def noise_warnings(
    rows: Sequence[Row], pin: Pinning, connections: int, who: str = "the gateway"
) -> list[str]:
    """Say when something other than the benchmark competed for the CPUs (``who``: what the
    non-direct rows measured)."""
    out: list[str] = []
    cores = [c for c in (pin.gw, pin.load) if c is not None]
    for r in rows:
        if r.m is None:
            continue
        busy = {c: b for c, b in r.m.idle_busy.items() if (not cores or c in cores) and b > 10}
        if busy:
            desc = ", ".join(f"CPU {c} {b:.0f}%" for c, b in sorted(busy.items()))
            out.append(
                f"{r.target}: before its run, with the benchmark idle, {desc} busy: another "
                "process competes for the cores and the figures are noisy (rerun when quiet)"
            )
        steal = {c: v for c, v in r.m.run_steal.items() if v > 5}
        if steal:
            desc = ", ".join(f"CPU {c} {v:.0f}%" for c, v in sorted(steal.items()))
            out.append(f"{r.target}: hypervisor steal during the run ({desc})")
        if r.target != "direct" and r.m.gw_cpu_pct is not None and r.m.gw_cpu_pct < 85:
            load = r.m.run_busy.get(pin.load, 0.0) if pin.load is not None else 0.0
            why = (
                f"the load core was {load:.0f}% busy (wrk, nginx, helpers, and anything else"
                " running there): the load side is the bottleneck"
                if load > 95
                else "it was starved or waited on something other than CPU"
            )
            out.append(
                f"{r.target}: {who} used only {r.m.gw_cpu_pct:.0f}% of its core at "
                f"c{connections}; {why}"
            )
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def tool_version(argv: list[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except OSError:
        return "?"
    out = (res.stdout + res.stderr).strip().splitlines()
    return out[0] if out else "?"


def machine_facts(pin: Pinning, args: argparse.Namespace, warmup_s: float = WARMUP_S) -> str:
    aff = sorted(os.sched_getaffinity(0))
    wrk_v = tool_version(["wrk", "--version"]).split("Copyright")[0].strip()
    nginx_v = tool_version([find_tool("nginx") or "nginx", "-v"]).replace("nginx version: ", "")
    nginx_v = nginx_v.removeprefix("nginx/")
    return "\n".join(
        [
            f"- CPU: {cpu_model()} ({len(aff)} usable CPUs: {aff})",
            f"- Python: {platform.python_version()} ({sys.executable})",
            f"- pinning: {pin.describe()}",
            f"- load: {wrk_v}, -t1, -c{args.connections} for req/s and -c1 --latency for "
            f"percentiles, {args.duration:g}s each after a {warmup_s:g}s warm-up"
            + (f", best of {args.repeat} rounds" if args.repeat > 1 else ""),
            f"- upstream: nginx {nginx_v}, `return 200` + a fixed chat.completion "
            f"({len(UPSTREAM_BODY)} bytes)",
        ]
    )


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Gateway overhead: wrk -> nginx direct vs through the gateway.",
        epilog="variants: " + ", ".join(VARIANTS),
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds per measurement [10]")
    p.add_argument(
        "--variant",
        action="append",
        choices=list(VARIANTS),
        metavar="NAME",
        help=f"gateway variant to measure (repeatable) [{', '.join(DEFAULT_VARIANTS)}]",
    )
    p.add_argument("--cores", help="GW_CORE,LOAD_CORE to pin to [the first two usable CPUs]")
    p.add_argument("--connections", type=int, default=32, help="wrk connections for req/s [32]")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of c=32 + c=1 per target; the best is shown, the spread noted [1]",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="also measure core with this many worker processes (on every usable core) [1]",
    )
    p.add_argument(
        "--before",
        type=Path,
        metavar="SRC",
        help="also measure core from another source tree (e.g. a git worktree of an earlier "
        "commit), as the row core@<dir name>, right before this tree's core",
    )
    p.add_argument(
        "--before-variant",
        action="append",
        metavar="NAME",
        help="with --before: measure this variant from that tree too (repeatable) [core]",
    )
    p.add_argument("--list", action="store_true", help="list the variants and exit")
    args = p.parse_args(argv)
    if args.duration < 1:
        p.error("--duration must be >= 1 (wrk counts whole seconds)")
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.connections < 1:
        p.error("--connections must be >= 1")
    return args


def _usage_error(msg: str) -> typing.NoReturn:
    print(f"overhead.py: {msg}", file=sys.stderr)
    raise SystemExit(2)


def choose_pinning(cores: str | None) -> Pinning:
    aff = sorted(os.sched_getaffinity(0))
    if cores:
        try:
            gw, load = (int(c) for c in cores.split(","))
        except ValueError:
            _usage_error(f"--cores: expected GW_CORE,LOAD_CORE, got {cores!r}")
        bad = [c for c in (gw, load) if c not in aff]
        if bad or gw == load:
            _usage_error(f"--cores: need two different CPUs from {aff}, got {cores!r}")
    elif len(aff) >= 2:
        gw, load = aff[0], aff[1]
    else:
        print(
            f"warning: only {len(aff)} CPU available ({aff}); running unpinned, so the gateway "
            "competes with nginx and wrk for it and the figures understate the gateway",
            file=sys.stderr,
        )
        return Pinning(None, None)
    if not shutil.which("taskset"):
        print(
            "warning: taskset not found (Debian package util-linux); running unpinned",
            file=sys.stderr,
        )
        return Pinning(None, None)
    return Pinning(gw, load)


def find_tool(name: str) -> str | None:
    """``name`` on PATH, else in the sbin directories (Debian's nginx lives in /usr/sbin)."""
    return shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def check_tools() -> None:
    missing = []
    if not shutil.which("wrk"):
        missing.append("wrk (Debian package: wrk)")
    if not find_tool("nginx"):
        missing.append("nginx (Debian package: nginx-light or nginx; it must be on PATH)")
    if missing:
        print("overhead.py: missing tools:\n  " + "\n  ".join(missing), file=sys.stderr)
        raise SystemExit(2)


@contextlib.contextmanager
def tempdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gw-overhead-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def list_variants() -> None:
    width = max(map(len, VARIANTS))
    for name, v in VARIANTS.items():
        extra = f" (wrk/{v.lua})" if v.lua != "chat.lua" else ""
        print(f"{name:<{width}}  {v.description}{extra}")


def measure_variants(
    bench: Bench,
    selected: list[str],
    rows: list[Row],
    before: Path | None = None,
    before_variants: Sequence[str] = (BASELINE,),
) -> bool:
    """Run each selected variant into ``rows`` (with ``before``, each of ``before_variants``
    from that source tree too, right before this tree's); True when one of them failed."""
    failed = False
    for name in selected:
        if before is not None and name in before_variants:
            failed |= _measure_before(bench, before, rows, name)
        row = Row(name)
        rows.append(row)
        reason = bench.skip_reason(name)
        if reason:
            row.note = "skipped"
            print(f"note: skipping variant {name}: {reason}", file=sys.stderr)
            continue
        print(f"{name}: {VARIANTS[name].description} ...", file=sys.stderr)
        try:
            row.m = bench.run_variant(name)
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            failed = True
            row.note = "failed"
            print(f"error: variant {name}: {exc}", file=sys.stderr)
    return failed


def _measure_before(bench: Bench, src: Path, rows: list[Row], name: str = BASELINE) -> bool:
    row = Row(f"{name}@{src.name}")
    rows.append(row)
    print(f"{row.target}: {name} from {src} ...", file=sys.stderr)
    try:
        row.m = bench.run_variant(name, src=src)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        row.note = "failed"
        print(f"error: {row.target}: {exc}", file=sys.stderr)
        return True
    return False


def truth_lines(rows: Sequence[Row]) -> list[str]:
    """The truth column in words: the gateway's reported overhead p50 against the added p50
    wrk measured over the same c=1 requests."""
    direct = next((r for r in rows if r.target == "direct" and r.m), None)
    out = []
    for r in rows:
        m = r.m
        if r.target == "direct" or m is None or m.reported_p50_ms is None or direct is None:
            continue
        if m.lat.p50_ms is None or direct.m is None or direct.m.lat.p50_ms is None:
            continue
        added = m.lat.p50_ms - direct.m.lat.p50_ms
        gap = added - m.reported_p50_ms
        verdict = "within" if abs(gap) <= TRUTH_TOLERANCE_MS else "OUTSIDE"
        out.append(
            f"truth {r.target}: the gateway reported {m.reported_p50_ms:.3f} ms overhead p50 "
            f"(Server-Timing gateway;dur, {m.reported_n:,} responses), wrk measured "
            f"{added:.3f} ms added p50: {gap:+.3f} ms unreported, {verdict} the "
            f"±{TRUTH_TOLERANCE_MS} ms target"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workers > 1:  # core with N workers, as its own row
        name = f"workers-{args.workers}"
        VARIANTS[name] = Variant(
            f"core with [server] workers = {args.workers} on every usable core",
            VARIANTS[BASELINE].toml,
            workers=args.workers,
        )
        args.variant = [*(args.variant or DEFAULT_VARIANTS), name]
    if args.list:
        list_variants()
        return 0
    check_tools()
    pin = choose_pinning(args.cores)
    selected = list(dict.fromkeys(args.variant or DEFAULT_VARIANTS))
    rows: list[Row] = [Row("direct")]
    failed = False
    for sig in (signal.SIGTERM, signal.SIGHUP):  # clean up like Ctrl-C does
        signal.signal(sig, _interrupt)
    with tempdir() as tmp:
        bench = Bench(args, pin, tmp)
        try:
            bench.start_nginx()
            print(f"direct: nginx on 127.0.0.1:{bench.nginx_port} ...", file=sys.stderr)
            rows[0].m = bench.measure(bench.nginx_port, "chat.lua")
            failed = measure_variants(
                bench, selected, rows, args.before, args.before_variant or (BASELINE,)
            )
        except KeyboardInterrupt:
            print("interrupted; stopping everything", file=sys.stderr)
            return 130
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            bench.procs.stop_all()
    print(f"## Gateway overhead ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
    print(machine_facts(pin, args) + "\n")
    print(render(rows, args.connections) + "\n")
    print(ratio_line(rows))
    for line in truth_lines(rows):
        print(line)
    warnings = noise_warnings(rows, pin, args.connections)
    for r in rows:
        if r.m and any(x.errors for x in (*r.m.all_thr, *r.m.all_lat)):
            failed = True
            warnings.append(
                f"{r.target}: errors during the run "
                f"({describe_errors(*r.m.all_thr, *r.m.all_lat)}); its figures are not comparable"
            )
    notes = [f"{r.target}: {n}" for r in rows if r.m for n in r.m.notes]
    if notes or warnings:
        print()
    for n in notes:
        print(f"note: {n}")
    for w in warnings:
        print(f"warning: {w}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
