"""``gateway`` command line (docs/spec.md §3)."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from gateway import cli_admin as admin_cli
from gateway.config import CONFIG_ENV, Config, ConfigError, load_config

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway", description="OpenTelemetry-traced LLM gateway")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    # -c as well: under `opentelemetry-instrument`, "--config" is an ambiguous prefix of its
    # own options (--config_file, --configurator) and never reaches us
    s.add_argument(
        "-c", "--config", help=f"TOML config (default: ${CONFIG_ENV}, else embedded default)"
    )
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--workers", type=int)
    s.add_argument(
        "--data-dir",
        help="where the key store's SQLite file lives ([admin] data_dir; docs/spec.md §28)",
    )

    c = sub.add_parser("check-config", help="validate a config file (exit 0 valid, 2 invalid)")
    c.add_argument("path")

    r = sub.add_parser(
        "reload",
        help="check the config, then have the running gateway re-read it (SIGHUP)",
        description="Validate the config (exit 2 with every error, nothing signalled), then "
        "send SIGHUP to the gateway whose id --pid names, else the pid file (--pid-file, "
        "else the config's [server] pid_file) holds (docs/spec.md §29).",
    )
    r.add_argument("-c", "--config", help=f"TOML config (default: ${CONFIG_ENV})")
    r.add_argument("--pid-file", help="the file `gateway serve` wrote ([server] pid_file)")
    r.add_argument("--pid", type=int, help="the process id of `gateway serve`")

    m = sub.add_parser("mock-upstream", help="serve the built-in OpenAI-compatible mock")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=9000)
    m.add_argument("--ttft-ms", type=float, default=0.0)
    m.add_argument("--tokens-per-s", type=float, default=0.0)
    m.add_argument("--output-tokens", type=int, default=None, help="answer length [12]")
    m.add_argument("--latency-ms", type=float, default=0.0)
    m.add_argument(
        "--capacity",
        type=int,
        default=None,
        metavar="N",
        help="run at most N requests at once, queue the rest, report both at /metrics "
        "in vLLM's names (docs/spec.md §21) [unbounded]",
    )

    h = sub.add_parser("hash-key", help="print the sha256 hex digest of an API key for [auth]")
    h.add_argument("key")

    _add_probe_and_doctor(sub)
    admin_cli.add_parsers(sub)  # gateway keys … / gateway tenants … (docs/spec.md §28)
    return p


def _add_probe_and_doctor(sub: Any) -> None:
    pr = sub.add_parser(
        "probe",
        help="curl-style timing of one GET: DNS, connect, TLS, TTFB, total",
        description="Time one GET like curl -w: marks are cumulative from the start "
        "(time_namelookup, time_connect, time_appconnect, time_starttransfer, time_total).",
    )
    pr.add_argument("url")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.add_argument("--timeout", type=float, default=10.0, help="seconds for the whole probe")
    pr.add_argument("--cacert", help="CA bundle to verify https with (default: system store)")

    d = sub.add_parser(
        "doctor",
        help="the slow-response checklist against an OpenAI-compatible base URL (docs/spec.md §17)",
        description="Run the latency checklist against BASE_URL (e.g. http://127.0.0.1:8080/v1). "
        "Exit 0 when no check fails, 1 when one does, 2 when the target cannot be checked.",
    )
    d.add_argument("base_url", metavar="BASE_URL")
    d.add_argument("--model", help="model to ask (default: the first one GET /models lists)")
    d.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="env var holding the API key, sent as Authorization: Bearer (default: %(default)s)",
    )
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.add_argument(
        "--requests",
        type=_at_least_two,
        default=5,
        metavar="N",
        help="requests for the connection-reuse check (default: %(default)s)",
    )
    d.add_argument(
        "--threshold",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME=MS",
        help="override a threshold, e.g. ttfb=500 (names: docs/guide-observability.md)",
    )
    d.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    d.add_argument("--cacert", help="CA bundle to verify https with (default: system store)")
    d.add_argument(
        "--idle-wait",
        type=float,
        default=0.0,
        metavar="S",
        help="leave a connection idle this long to see whether it ends with GOAWAY; longer than "
        "the server's idle timeout (default: %(default)s, not checked)",
    )


def _at_least_two(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if n < 2:
        raise argparse.ArgumentTypeError("needs at least 2 requests to see reuse")
    return n


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command: str = args.command
    handler = {
        "serve": _serve,
        "check-config": _check_config,
        "reload": _reload,
        "mock-upstream": _mock_upstream,
        "hash-key": _hash_key,
        "probe": _probe,
        "doctor": _doctor,
        "keys": admin_cli.run,
        "tenants": admin_cli.run,
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
    if args.config:
        os.environ[CONFIG_ENV] = os.path.abspath(args.config)  # workers re-load it from here
    # CLI flags are overrides like any other: pass them the same way to worker processes
    for flag, key in (("host", "HOST"), ("port", "PORT"), ("workers", "WORKERS")):
        value = getattr(args, flag)
        if value is not None:
            os.environ[f"GATEWAY__SERVER__{key}"] = str(value)
    if args.data_dir is not None:
        os.environ["GATEWAY__ADMIN__DATA_DIR"] = os.path.abspath(args.data_dir)
    config = _load_or_exit(None)
    from gateway.live.sign_in import ensure_secret
    from gateway.server.process import serve  # the server: the client guards, the SIGTERM drain

    ensure_secret(os.environ)  # the live view's sessions hold in every worker (docs/spec.md §18)
    return serve(config)


def _check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.path)
    except ConfigError as exc:
        for line in exc.errors:
            print(line)
        return EXIT_CONFIG
    print(f"{args.path}: valid ({len(cfg.backends)} backends, {len(cfg.routes)} routes)")
    return 0


def _reload(args: argparse.Namespace) -> int:
    import signal

    config = _load_or_exit(args.config)  # a config that would not load is never signalled
    pid: int | None = args.pid
    pid_file = args.pid_file or config.server.pid_file
    if pid is None and pid_file is None:
        print(
            "reload: which gateway? --pid PID, --pid-file PATH, or [server] pid_file",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if pid is None:
        assert pid_file is not None
        try:
            with open(pid_file, encoding="ascii") as f:
                pid = int(f.read().strip())
        except (OSError, ValueError) as exc:
            print(f"reload: cannot read a process id from {pid_file}: {exc}", file=sys.stderr)
            return 1
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        print(f"reload: no process {pid} (a stale pid file?)", file=sys.stderr)
        return 1
    except PermissionError:
        print(f"reload: not allowed to signal process {pid}", file=sys.stderr)
        return 1
    print(
        f"reload: {config.source} is valid; sent SIGHUP to process {pid}: the gateway logs "
        "the result and counts it in gateway_config_reloads_total"
    )
    return 0


def _mock_upstream(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.mock.engine import MockSettings
    from gateway.mock.upstream_app import create_mock_app

    settings = MockSettings(
        latency_ms=args.latency_ms, ttft_ms=args.ttft_ms, tokens_per_s=args.tokens_per_s
    )
    if args.output_tokens is not None:  # validated like the header and URL knobs
        settings = settings.with_overrides({"output_tokens": str(args.output_tokens)})
    if args.capacity is not None:  # a small model server: a bounded batch and a queue
        from dataclasses import replace

        from gateway.mock.capacity import Capacity, parse_capacity

        try:
            limit = parse_capacity(str(args.capacity))
        except ValueError as exc:
            print(f"mock-upstream: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        settings = replace(settings, capacity=Capacity(limit))
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


# ---------------------------------------------------------------- probe, doctor


def _probe(args: argparse.Namespace) -> int:
    import json

    from gateway.client.probe import ProbeError, probe

    try:
        result = probe(args.url, timeout=args.timeout, cacert=args.cacert)
    except ValueError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ProbeError as exc:
        print(f"probe: {exc.message}", file=sys.stderr)
        return 1
    print(json.dumps(result.as_json()) if args.json else result.render())
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from gateway.client import doctor

    try:
        thresholds = doctor.parse_thresholds(args.threshold)
    except ValueError as exc:
        print(f"doctor: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    options = doctor.Options(
        base_url=args.base_url,
        model=args.model,
        api_key=os.environ.get(args.api_key_env) or None,
        requests=args.requests,
        thresholds=thresholds,
        timeout=args.timeout,
        cacert=args.cacert,
        idle_wait=args.idle_wait,
    )
    try:
        report = doctor.run(options)
    except doctor.DoctorError as exc:
        print(f"doctor: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(report.to_json() if args.json else report.render())
    return report.exit_code()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
