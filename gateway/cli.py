"""``gateway`` command line (SPEC §3)."""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from gateway.config import CONFIG_ENV, Config, ConfigError, load_config

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway", description="OpenTelemetry-traced LLM gateway")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", help=f"TOML config (default: ${CONFIG_ENV}, else embedded default)")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--workers", type=int)

    c = sub.add_parser("check-config", help="validate a config file (exit 0 valid, 2 invalid)")
    c.add_argument("path")

    m = sub.add_parser("mock-upstream", help="serve the built-in OpenAI-compatible mock")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=9000)
    m.add_argument("--ttft-ms", type=float, default=0.0)
    m.add_argument("--tokens-per-s", type=float, default=0.0)
    m.add_argument("--latency-ms", type=float, default=0.0)

    h = sub.add_parser("hash-key", help="print the sha256 hex digest of an API key for [auth]")
    h.add_argument("key")

    pr = sub.add_parser(
        "probe", help="curl-style timing of one GET: DNS, connect, TLS, TTFB, total"
    )
    pr.add_argument("url")
    pr.add_argument("--timeout", type=float, default=10.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command: str = args.command
    handler = {
        "serve": _serve,
        "check-config": _check_config,
        "mock-upstream": _mock_upstream,
        "hash-key": _hash_key,
        "probe": _probe,
    }[command]
    return handler(args)


# ---------------------------------------------------------------- serve


def _load_or_exit(path: str | None) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        for line in exc.errors:
            print(line, file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    if args.config:
        os.environ[CONFIG_ENV] = os.path.abspath(args.config)  # workers re-load it from here
    # CLI flags are overrides like any other: pass them the same way to worker processes
    for flag, key in (("host", "HOST"), ("port", "PORT"), ("workers", "WORKERS")):
        value = getattr(args, flag)
        if value is not None:
            os.environ[f"GATEWAY__SERVER__{key}"] = str(value)
    config = _load_or_exit(None)
    server = config.server
    common: dict[str, Any] = dict(
        host=server.host,
        port=server.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        proxy_headers=False,  # the edge hop decides whom to trust (edge.trusted_proxies)
        server_header=False,
        access_log=False,  # the gateway writes its own access log
        timeout_graceful_shutdown=int(server.shutdown_grace_s) or None,
        log_level=config.logging.level,
        backlog=4096,
    )
    print(
        f"gateway: serving on http://{server.host}:{server.port} (config: {config.source})",
        file=sys.stderr,
        flush=True,
    )
    if server.workers > 1:
        uvicorn.run("gateway.app:create_app", factory=True, workers=server.workers, **common)
    else:
        from gateway.app import Gateway

        uvicorn.run(Gateway(config), **common)
    return 0


def _check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.path)
    except ConfigError as exc:
        for line in exc.errors:
            print(line)
        return EXIT_CONFIG
    print(f"{args.path}: valid ({len(cfg.backends)} backends, {len(cfg.routes)} routes)")
    return 0


def _mock_upstream(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.mock.engine import MockSettings
    from gateway.mock.server import create_mock_app

    settings = MockSettings(
        latency_ms=args.latency_ms, ttft_ms=args.ttft_ms, tokens_per_s=args.tokens_per_s
    )
    print(f"mock-upstream: http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(
        create_mock_app(settings),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        lifespan="off",
        server_header=False,
    )
    return 0


def _hash_key(args: argparse.Namespace) -> int:
    print(hashlib.sha256(args.key.encode()).hexdigest())
    return 0


# ---------------------------------------------------------------- probe


def _probe(args: argparse.Namespace) -> int:
    import httpx2

    url: str = args.url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        print(f"probe: not an http(s) URL: {url}", file=sys.stderr)
        return EXIT_CONFIG
    marks: dict[str, float] = {}
    start = time.perf_counter()
    try:
        socket.getaddrinfo(
            parts.hostname,
            parts.port or (443 if parts.scheme == "https" else 80),
            type=socket.SOCK_STREAM,
        )
    except OSError as exc:
        print(f"probe: DNS lookup of {parts.hostname} failed: {exc}", file=sys.stderr)
        return 1
    marks["dns"] = time.perf_counter()

    def trace(event: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if event == "connection.connect_tcp.complete":
            marks["connect"] = now
        elif event == "connection.start_tls.complete":
            marks["tls"] = now
        elif event.endswith("receive_response_headers.complete"):
            marks["ttfb"] = now

    try:
        with (
            httpx2.Client(timeout=args.timeout, trust_env=False, http2=True) as client,
            client.stream("GET", url, extensions={"trace": trace}) as resp,
        ):
            size = sum(len(c) for c in resp.iter_raw())
            status, version = resp.status_code, resp.http_version
    except httpx2.HTTPError as exc:
        print(f"probe: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    marks["total"] = time.perf_counter()
    print(f"{url}  status={status}  {version}  {size} bytes")
    # cumulative from the start, like curl -w time_namelookup/time_connect/...
    for name in ("dns", "connect", "tls", "ttfb", "total"):
        value = f"{(marks[name] - start) * 1000:9.2f} ms" if name in marks else "        -"
        print(f"  {name:<8}{value}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
