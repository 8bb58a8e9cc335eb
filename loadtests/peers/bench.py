"""The peers benchmark's run: install, start, check, measure, stop; then one table.

The harness is ``loadtests/overhead.py``'s: its nginx upstream (with ``streams=True``, so a
stream can be checked against it too), its wrk runs (an idle probe of the CPUs, a warm-up, req/s
at ``--connections`` and latency at c=1), its core pinning and its CPU accounting from /proc (the
proxy's process and all its children). The gateway rows are overhead.py's variants ``core`` and
``everything``, started and stopped by it; each peer is started here, on the core the gateway
gets, and stopped by its own PID (and any process it started, by theirs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import overhead
from overhead import Bench, Measurement

from peers.check import check_json, check_stream, wait_ready
from peers.install import Installed, InstallError, ensure
from peers.proxies import API_KEY, MODEL, PEERS, Peer, peer_env
from peers.report import report

#: the gateway rows: overhead.py's variants of these names
GATEWAY_ROWS = ("core", "everything")
TARGETS = (*GATEWAY_ROWS, *PEERS)
DEFAULT_CACHE = overhead.HERE / ".peers"
#: the headers wrk's chat.lua sends, for the checks
CLIENT_HEADERS = {"Authorization": f"Bearer {API_KEY}"}
#: longer than overhead.py's 2 s: Node's V8 optimises hot code only after many requests (seen
#: here: Portkey's CPU per request still falling after 1,500); the other rows lose nothing by it
WARMUP_S = 5.0


@dataclass
class Result:
    """One row: what was measured (``m``), or why not (``reason``)."""

    target: str
    label: str
    version: str = ""
    m: Measurement | None = None
    reason: str = ""
    #: how it was installed and configured (peers), for the lines under the table
    about: str = ""


# ---------------------------------------------------------------- one target


def measure_gateway(bench: Bench, res: Result) -> None:
    """overhead.py's variant ``res.target``, checked (JSON and a stream) before it is measured."""

    def check(port: int) -> None:
        check_json(port, CLIENT_HEADERS, MODEL)
        check_stream(port, CLIENT_HEADERS, MODEL)

    try:
        res.m = bench.run_variant(res.target, check=check)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        res.reason = str(exc)


def peer_script(tmp: Path, peer: str, headers: dict[str, str]) -> str:
    """chat.lua, plus the peer's own request headers (a copy in the temp dir)."""
    if not headers:
        return "chat.lua"
    lines = [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    path = tmp / f"chat-{peer}.lua"
    text = (overhead.WRK_DIR / "chat.lua").read_text()
    path.write_text(text + f"\n-- loadtests/peers: {peer}'s headers\n" + "\n".join(lines) + "\n")
    return str(path)  # overhead.Bench joins it to WRK_DIR: an absolute path stays as it is


def measure_peer(bench: Bench, peer: Peer, env: Installed, res: Result) -> None:
    """Start ``peer`` pinned where the gateway runs, wait for it, check it, measure it, stop it
    (and whatever it started)."""
    port = overhead.free_port()
    launch = peer.launch(env.path, port, bench.nginx_port, bench.tmp)
    log = bench.tmp / f"{peer.name}.log"
    headers = {**CLIENT_HEADERS, **launch.headers}
    print(f"{peer.name}: starting on 127.0.0.1:{port} ...", file=sys.stderr)
    try:
        proc = bench.procs.start(
            peer.name, bench.pin.gateway(launch.argv), log, cwd=bench.tmp, env=peer_env(launch.env)
        )
    except OSError as exc:
        res.reason = f"could not start {launch.argv[0]}: {exc}"
        return
    try:
        ready_s = wait_ready(proc, port, headers, MODEL, peer.start_timeout_s, log)
        check_stream(port, headers, MODEL)
        res.m = bench.measure(port, peer_script(bench.tmp, peer.name, launch.headers), proc.pid)
        if proc.poll() is not None:
            raise RuntimeError(f"it exited during the run\n{overhead.tail(log)}")
        res.m.notes.append(f"answered its first chat completion {ready_s:.1f} s after its start")
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        res.m, res.reason = None, str(exc)  # no figures from a run it did not finish
    finally:
        t0 = time.monotonic()
        stop_tree(bench, proc)
        stop_s = time.monotonic() - t0
    if res.m is not None and stop_s > 5:
        res.m.notes.append(f"it took {stop_s:.1f} s to stop after SIGTERM")


def stop_tree(bench: Bench, proc: subprocess.Popen[bytes]) -> None:
    """Stop ``proc`` by its PID, then any process it had started that outlived it, by theirs
    (each checked by its start time, so a PID the system gave to someone else is left alone)."""
    started = [(pid, start_time(pid)) for pid in descendants(proc.pid)]
    bench.procs.stop(proc)
    left = [pid for pid, t in started if t is not None and start_time(pid) == t]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while left and time.monotonic() < deadline:
            left = [pid for pid, t in started if pid in left and start_time(pid) == t]
            time.sleep(0.1)


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for child in overhead.child_pids(pid):
        out += [child, *descendants(child)]
    return out


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


# ---------------------------------------------------------------- the run


def install_peers(
    selected: Sequence[str], cache: Path, results: dict[str, Result]
) -> dict[str, Installed]:
    """Each selected peer's environment (installed now if it is not yet); a peer that cannot
    be installed gets its reason instead."""
    envs: dict[str, Installed] = {}
    for name in selected:
        if name not in PEERS:
            continue
        peer, res = PEERS[name], results[name]
        try:
            env = ensure(cache, name, peer.kind, peer.spec, peer.version, peer.overrides)
        except (InstallError, OSError) as exc:
            res.reason = f"install failed: {exc}"
            continue
        envs[name] = env
        res.version = env.version
        res.about = f"{peer.how}; {env.describe()}"
        print(f"{name}: {res.about}", file=sys.stderr)
    return envs


def run(args: argparse.Namespace, pin: overhead.Pinning, selected: list[str]) -> list[Result]:
    results = {name: Result(name, label(name)) for name in selected}
    for name in GATEWAY_ROWS:
        if name in results:
            results[name].version = tree_version()
    envs = install_peers(selected, args.cache_dir, results)
    direct = Result("direct", "direct (nginx, no proxy)")
    with overhead.tempdir() as tmp:
        bench = Bench(args, pin, tmp)
        bench.warmup_s = args.warmup
        try:
            bench.start_nginx(streams=True)
            print(f"direct: nginx on 127.0.0.1:{bench.nginx_port} ...", file=sys.stderr)
            direct.m = bench.measure(bench.nginx_port, "chat.lua")
            for name in selected:
                res = results[name]
                if res.reason:
                    continue
                print(f"{name}: {res.label} ...", file=sys.stderr)
                if name in GATEWAY_ROWS:
                    measure_gateway(bench, res)
                else:
                    measure_peer(bench, PEERS[name], envs[name], res)
                if res.reason:
                    print(f"error: {name}: {res.reason}", file=sys.stderr)
        finally:
            bench.procs.stop_all()
    return [direct, *results.values()]


def label(name: str) -> str:
    return f"gateway {name}" if name in GATEWAY_ROWS else name


def tree_version() -> str:
    """This tree's commit (``+changes`` when gateway/ differs from it)."""

    def git(*argv: str) -> str:
        cmd = ["git", "-C", str(overhead.REPO), *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        rev, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "gateway")
    except (OSError, subprocess.TimeoutExpired):
        return "this tree"
    return (rev or "this tree") + ("+changes" if dirty else "")


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python loadtests/peers",
        description="This gateway beside other LLM proxies, one upstream, one run.",
        epilog="targets: " + ", ".join(TARGETS),
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds per measurement [10]")
    p.add_argument(
        "--warmup",
        type=float,
        default=WARMUP_S,
        help=f"seconds of load before each target's measurement (JITs warm up) [{WARMUP_S:g}]",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=TARGETS,
        metavar="NAME",
        help="measure only this target (repeatable) [all: " + ", ".join(TARGETS) + "]",
    )
    p.add_argument("--cores", help="PROXY_CORE,LOAD_CORE to pin to [the first two usable CPUs]")
    p.add_argument("--connections", type=int, default=32, help="wrk connections for req/s [32]")
    p.add_argument("--repeat", type=int, default=1, help="rounds per target; the best is shown [1]")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE,
        help="where the peers' environments are installed [loadtests/.peers]",
    )
    p.add_argument("--list", action="store_true", help="list the targets and exit")
    args = p.parse_args(argv)
    if args.duration < 1 or args.warmup < 1:
        p.error("--duration and --warmup must be >= 1 (wrk counts whole seconds)")
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.connections < 1:
        p.error("--connections must be >= 1")
    args.cache_dir = args.cache_dir.expanduser().resolve()
    return args


def list_targets() -> str:
    lines = [f"{name:<12} overhead.py's variant: {overhead.VARIANTS[name].description}"
             for name in GATEWAY_ROWS]  # fmt: skip
    lines += [f"{p.name:<12} {p.spec}: {p.how}" for p in PEERS.values()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(list_targets())
        return 0
    overhead.check_tools()
    pin = overhead.choose_pinning(args.cores)
    selected = list(dict.fromkeys(args.only or TARGETS))
    for sig in (signal.SIGTERM, signal.SIGHUP):  # clean up like Ctrl-C does
        signal.signal(sig, overhead._interrupt)
    try:
        results = run(args, pin, selected)
    except KeyboardInterrupt:
        print("interrupted; stopped everything", file=sys.stderr)
        return 130
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    npm = any(PEERS[name].kind == "npm" for name in selected if name in PEERS)
    text, failed = report(results, pin, args, node_version() if npm else None)
    print(text)
    return 1 if failed else 0


def node_version() -> str | None:
    node = shutil.which("node")
    return overhead.tool_version([node, "--version"]) if node else None
