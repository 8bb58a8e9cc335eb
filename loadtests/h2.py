"""HTTP/2 at the gateway's edge (docs/spec.md §27): h2load against nginx directly, nginx as an
HTTP/2 proxy and the gateway, in one run.

    python loadtests/h2.py [--requests 100000] [--clients 32] [--streams 10] [--cores GW,LOAD]
                           [--h2c] [--repeat 1]

Every target answers ``POST /v1/chat/completions`` with the same fixed ``chat.completion`` body
(overhead.py's): nginx itself (``return 200``) — the ceiling of the load side and the network —,
nginx terminating HTTP/2 in front of that nginx (``proxy_pass`` over HTTP/1.1 keep-alive: what a
conventional HTTP/2 proxy costs), and the gateway terminating HTTP/2 in front of it (its whole
request path: routing, spans off, cache off, the relay). Over TLS by default (ALPN h2, a
certificate made for the run with trustme); ``--h2c`` runs the same in clear by prior knowledge.

Two HTTP/1.1 rows follow, for the protocol's own cost on the same gateway: ``h2load --h1``
against the gateway over the same TLS port (or in clear with ``--h2c``), and in plain TCP
without TLS or h2c — the configuration ``overhead.py``'s ``core`` measures, whose throughput
this change must leave as it was (compare with ``overhead.py --before SRC``).

Prints req/s per target and each target's ratio to ``direct``. The gateway runs pinned to one
core (``taskset``), nginx and h2load share the other, as in ``overhead.py``; everything it starts
is stopped by its own PID and its temp dir removed. All traffic stays on 127.0.0.1. Exit
status: 0 ok, 1 a run failed or saw errors, 2 missing tools (``h2load``: Debian's
``nghttp2-client``; ``nginx`` or ``nginx-light``; ``taskset``) or bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from overhead import (  # noqa: E402 - the helpers of the benchmark next door
    PROBE_BODY,
    UPSTREAM_BODY,
    Pinning,
    Procs,
    find_tool,
    free_port,
    nginx_conf,
    port_open,
    wait_until,
)

#: what the h2 benchmark's nginx adds to the common head (:func:`overhead.nginx_conf`)
NGINX_H2 = """\
http2_max_requests 1000000000;
http2_max_concurrent_streams 128;
server_tokens off;
"""


def _answering(listen: str) -> str:
    """A server block answering every request with overhead.py's fixed body."""
    body = UPSTREAM_BODY.replace("\\", "\\\\").replace("'", "\\'")
    assert "$" not in body  # nginx would expand it as a variable
    return (
        f"server {{\n    {listen}\n    default_type application/json;\n"
        f"    location / {{ return 200 '{body}'; }}\n}}"
    )


@dataclass
class Result:
    target: str
    rps: float = 0.0
    done: int = 0
    failed: int = 0
    non_2xx: int = 0
    note: str = ""


class H2Bench:
    def __init__(self, args: argparse.Namespace, pin: Pinning, tmp: Path) -> None:
        self.args = args
        self.pin = pin
        self.tmp = tmp
        self.procs = Procs()
        self.cert, self.key = self._certificate()
        self.body = tmp / "body.json"
        self.body.write_bytes(PROBE_BODY)

    def _certificate(self) -> tuple[Path, Path]:
        import trustme  # the project's test extra (scripts/setup installs it)

        issued = trustme.CA().issue_cert("127.0.0.1", "localhost")
        cert, key = self.tmp / "cert.pem", self.tmp / "key.pem"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        return cert, key

    # -- servers ----------------------------------------------------------

    def nginx(self, name: str, server: str) -> int:
        """An nginx with one ``server`` block (``@PORT@`` and ``@LISTEN@`` filled in); its
        port."""
        root = self.tmp / name
        for sub in ("logs", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        port = free_port()
        server = server.replace("@LISTEN@", self._listen(port)).replace("@PORT@", str(port))
        conf = root / "nginx.conf"
        conf.write_text(nginx_conf(root, NGINX_H2 + server.rstrip("\n") + "\n"))
        log = root / "logs" / "stdout.log"
        argv = [find_tool("nginx") or "nginx", "-p", str(root), "-c", str(conf)]
        argv += ["-e", str(root / "logs" / "error.log")]
        proc = self.procs.start(name, self.pin.loader(argv), log)
        wait_until(lambda: port_open(port), proc, name, log)
        return port

    def _listen(self, port: int) -> str:
        if self.args.h2c:
            return f"listen 127.0.0.1:{port} http2 backlog=4096;"
        return (
            f"listen 127.0.0.1:{port} ssl http2 backlog=4096;\n"
            f"ssl_certificate {self.cert};\nssl_certificate_key {self.key};"
        )

    def upstream(self) -> int:
        """nginx answering every request with the fixed body, in plain HTTP/1.1."""
        return self.nginx("upstream", _answering("listen 127.0.0.1:@PORT@ backlog=4096;"))

    def direct(self) -> int:
        """The same answer from nginx speaking HTTP/2 itself."""
        return self.nginx("direct", _answering("@LISTEN@"))

    def proxy(self, upstream: int) -> int:
        """nginx terminating HTTP/2, proxying over HTTP/1.1 keep-alive to the upstream."""
        server = (
            f"upstream up {{ server 127.0.0.1:{upstream}; keepalive 64; }}\n"
            "server {\n    @LISTEN@\n    location / {\n"
            "        proxy_pass http://up;\n        proxy_http_version 1.1;\n"
            '        proxy_set_header Connection "";\n    }\n}'
        )
        return self.nginx("proxy", server)

    def gateway(self, upstream: int, edge: str) -> int:
        """``gateway serve`` pinned; ``edge``: "tls", "h2c" or "plain"."""
        port = free_port()
        toml = f"""\
[server]
host = "127.0.0.1"
port = {port}
shutdown_grace_s = 2
{"h2c = true" if edge == "h2c" else ""}

[server.http2]
max_concurrent_streams = 128
max_requests_per_connection = 1000000000

[[backends]]
name = "nginx"
url = "http://127.0.0.1:{upstream}/v1"

[[routes]]
name = "all"
models = ["*"]
backends = ["nginx"]

[logging]
access_log = "off"

[cache]
backend = "off"

[tracing]
exporter = "none"

[ui]
enabled = false
"""
        if edge == "tls":
            toml += f'\n[server.tls]\ncert_file = "{self.cert}"\nkey_file = "{self.key}"\n'
        cfg = self.tmp / f"gateway-{edge}.toml"
        cfg.write_text(toml)
        log = self.tmp / f"gateway-{edge}.log"
        argv = [sys.executable, "-m", "gateway.cli", "serve", "-c", str(cfg)]
        proc = self.procs.start(f"gateway-{edge}", self.pin.gateway(argv), log, cwd=REPO)
        wait_until(lambda: port_open(port), proc, f"gateway ({edge})", log)
        return port

    # -- load -------------------------------------------------------------

    def h2load(self, target: str, port: int, *, h1: bool = False, tls: bool = True) -> Result:
        scheme = "https" if tls else "http"
        url = f"{scheme}://127.0.0.1:{port}/v1/chat/completions"
        a = self.args
        argv = ["h2load", "-c", str(a.clients), "-t", "1", "-d", str(self.body)]
        argv += ["-H", "content-type: application/json"]
        if h1:
            argv.append("--h1")
        else:
            argv += ["-m", str(a.streams)]
        warm = min(a.requests, max(a.clients * 10, a.requests // 10))
        self._run([*argv, "-n", str(warm), url])
        best = Result(target)
        for _ in range(a.repeat):
            got = parse_h2load(target, self._run([*argv, "-n", str(a.requests), url]))
            if got.rps > best.rps:
                best = got
        return best

    def _run(self, argv: list[str]) -> str:
        out = subprocess.run(
            self.pin.loader(argv), capture_output=True, text=True, timeout=600, check=False
        )
        if out.returncode != 0:
            raise RuntimeError(f"h2load failed ({out.returncode}): {out.stderr.strip()}")
        return out.stdout

    def run(self) -> list[Result]:
        tls = not self.args.h2c
        edge = "tls" if tls else "h2c"
        upstream = self.upstream()
        results = [self.h2load("direct nginx", self.direct(), tls=tls)]
        results.append(self.h2load("nginx h2 proxy", self.proxy(upstream), tls=tls))
        gw = self.gateway(upstream, edge)
        results.append(self.h2load("gateway", gw, tls=tls))
        results.append(self.h2load(f"gateway HTTP/1.1 ({edge} port)", gw, h1=True, tls=tls))
        plain = self.gateway(upstream, "plain")
        results.append(self.h2load("gateway HTTP/1.1 (plain)", plain, h1=True, tls=False))
        return results


_FINISHED = re.compile(r"finished in [0-9.]+\w*, ([0-9.]+) req/s")
_REQUESTS = re.compile(r"requests: \d+ total, \d+ started, (\d+) done, \d+ succeeded, (\d+) failed")
_STATUS = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")


def parse_h2load(target: str, out: str) -> Result:
    """h2load's summary: req/s, requests done and failed, non-2xx answers."""
    result = Result(target)
    if m := _FINISHED.search(out):
        result.rps = float(m.group(1))
    if m := _REQUESTS.search(out):
        result.done, result.failed = int(m.group(1)), int(m.group(2))
    if m := _STATUS.search(out):
        result.non_2xx = sum(int(m.group(i)) for i in (2, 3, 4))
    return result


def report(results: list[Result], args: argparse.Namespace, pin: Pinning) -> str:
    base = results[0].rps or 1.0
    proto = "h2c (prior knowledge)" if args.h2c else "h2 over TLS (ALPN)"
    lines = [
        f"h2load: {args.requests} requests, {args.clients} clients, "
        f"{args.streams} streams each (HTTP/2 rows), {proto}; {pin.describe()}",
        "",
        "| target | req/s | vs direct | done | failed | non-2xx |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.target} | {r.rps:,.0f} | {r.rps / base:.2f} | {r.done} | {r.failed} | "
            f"{r.non_2xx} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=100_000, help="per target (default %(default)s)")
    p.add_argument("--clients", type=int, default=32, help="connections (default %(default)s)")
    p.add_argument("--streams", type=int, default=10, help="streams per connection (HTTP/2)")
    p.add_argument("--repeat", type=int, default=1, help="rounds per target; the best is shown")
    p.add_argument("--h2c", action="store_true", help="cleartext HTTP/2 instead of TLS")
    p.add_argument("--cores", default="0,1", help="GW,LOAD cores, or 'none' (default %(default)s)")
    return p.parse_args(argv)


def pinning(cores: str) -> Pinning:
    usable = sorted(os.sched_getaffinity(0))
    if cores == "none" or len(usable) < 2 or not find_tool("taskset"):
        return Pinning(None, None)
    gw, load = (int(c) for c in cores.split(","))
    return Pinning(gw, load)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [t for t in ("h2load", "nginx") if not find_tool(t)]
    if missing:
        print(
            f"h2.py: {', '.join(missing)} not found: apt-get install nghttp2-client nginx-light",
            file=sys.stderr,
        )
        return 2
    pin = pinning(args.cores)
    with tempfile.TemporaryDirectory(prefix="gateway-h2-") as tmp:
        bench = H2Bench(args, pin, Path(tmp))
        try:
            results = bench.run()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"h2.py: {exc}", file=sys.stderr)
            return 1
        finally:
            bench.procs.stop_all()
    print(report(results, args, pin))
    bad = [r for r in results if r.failed or r.non_2xx or r.done < args.requests]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
