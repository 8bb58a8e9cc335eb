"""A real Prometheus server for the tests (the Debian ``prometheus`` binary).

It is started by this module on a free loopback port with its own temp directory (config,
rule files, TSDB), a short scrape interval and exemplar storage on, and it is stopped by its
own PID, never by name. Queries go through its HTTP API, as Grafana's would.

It also reads what the deploy files ask Prometheus: every PromQL expression of the Grafana
dashboard (with its template variables substituted as Grafana would) and of the alert rules.

>>> with PrometheusServer(["127.0.0.1:8080"]) as prom:      # doctest: +SKIP
...     prom.wait_for_value("up", 1)
...     prom.query("sum(rate(gateway_requests_total[30s]))")
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import yaml

from tests.support import free_port

STARTUP_TIMEOUT_S = 20.0
JOB = "llm-gateway"
ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy/grafana/dashboards/llm-gateway.json"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
ALERTS_TEST = ROOT / "deploy/prometheus/alerts_test.yml"
DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/datasources.yml"

#: SPEC §11: every metric the gateway exposes, with its type and labels
CONTRACT: dict[str, tuple[str, frozenset[str]]] = {
    "gateway_requests_total": ("counter", frozenset({"route", "model", "status_code"})),
    "gateway_request_duration_seconds": ("histogram", frozenset({"route", "model"})),
    "gateway_upstream_duration_seconds": ("histogram", frozenset({"backend", "model"})),
    "gateway_overhead_seconds": ("histogram", frozenset({"route"})),
    "gateway_time_to_first_token_seconds": ("histogram", frozenset({"model"})),
    "gateway_hop_duration_seconds": ("histogram", frozenset({"hop"})),
    "gateway_tokens_total": ("counter", frozenset({"model", "kind"})),
    "gateway_errors_total": ("counter", frozenset({"status_code", "error_type"})),
    "gateway_cache_requests_total": ("counter", frozenset({"result"})),
    "gateway_inflight_requests": ("gauge", frozenset({"route"})),
    "gateway_backend_up": ("gauge", frozenset({"backend"})),
    "gateway_ratelimit_fallback": ("gauge", frozenset()),
    # realtime sessions (docs/spec.md §19)
    "gateway_realtime_sessions": ("gauge", frozenset()),
    "gateway_realtime_sessions_total": ("counter", frozenset({"close_code"})),
    "gateway_realtime_message_overhead_seconds": ("histogram", frozenset({"direction"})),
    # spend (docs/spec.md §20)
    "gateway_cost_usd_total": ("counter", frozenset({"route", "model", "tenant"})),
    "gateway_unpriced_requests_total": ("counter", frozenset({"model"})),
    "gateway_budget_used_ratio": ("gauge", frozenset({"tenant"})),
    # the model servers' load (docs/spec.md §21)
    "gateway_backend_queue_depth": ("gauge", frozenset({"backend"})),
    "gateway_backend_running_requests": ("gauge", frozenset({"backend"})),
    "gateway_backend_kv_cache_usage_ratio": ("gauge", frozenset({"backend"})),
    "gateway_backend_saturated": ("gauge", frozenset({"backend"})),
    "gateway_backend_metrics_age_seconds": ("gauge", frozenset({"backend"})),
    # MCP through the gateway (docs/spec.md §23)
    "gateway_mcp_requests_total": ("counter", frozenset({"server", "method", "tool", "status"})),
    "gateway_mcp_request_duration_seconds": ("histogram", frozenset({"server", "method"})),
    # config reloads (docs/spec.md §29)
    "gateway_config_reloads_total": ("counter", frozenset({"result"})),
    # A2A through the gateway (docs/spec.md §30)
    "gateway_a2a_requests_total": ("counter", frozenset({"agent", "method", "status"})),
    "gateway_a2a_request_duration_seconds": ("histogram", frozenset({"agent", "method"})),
}
#: a crude PromQL reading: anything that looks like one of our metric names
METRIC_NAME = re.compile(r"\bgateway_[a-z0-9_]+")

#: NVIDIA dcgm-exporter's series that the dashboard's "GPUs" row and the Gpu* alerts read (not
#: the gateway's: Prometheus scrapes the exporter as job ``dcgm-exporter``), with the labels the
#: exporter sets on each (framebuffer in MiB, GPU_UTIL in %, the PROF_ ratios 0..1)
DCGM_LABELS = frozenset(
    {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
)
DCGM: dict[str, frozenset[str]] = dict.fromkeys(
    (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ),
    DCGM_LABELS,
)
DCGM_NAME = re.compile(r"\bDCGM_FI_[A-Z_]+")


def series_names(contract: Mapping[str, tuple[str, frozenset[str]]] = CONTRACT) -> set[str]:
    """The series names a query may use: histograms as _bucket/_sum/_count, the rest as named."""
    out: set[str] = set()
    for name, (kind, _) in contract.items():
        if kind == "histogram":
            out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            out.add(name)
    return out


# ---------------------------------------------------------------- the dashboard, read


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard panel (or of an alert rule)."""

    where: str  # "panel title [refId]" or "alert Name"
    panel_type: str
    expr: str
    exemplar: bool = False


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return data


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested (collapsed) panels included; rows themselves excluded."""
    stack = list(reversed(dashboard.get("panels", [])))
    while stack:
        panel = stack.pop()
        if panel.get("type") == "row":
            stack.extend(reversed(panel.get("panels", [])))
            continue
        yield panel


def dashboard_queries(dashboard: Mapping[str, Any], source: str = "gateway") -> list[Query]:
    """The panels' queries of one ``source``: ``gateway`` — of the gateway's own metrics (what
    a live gateway gives data to, tests/test_prometheus_live.py); ``dcgm`` — of dcgm-exporter's
    (the "GPUs" row, evaluated against a stand-in exporter, tests/test_dashboards.py); ``all``."""
    out = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            if target.get("hide"):
                continue
            dcgm = bool(DCGM_NAME.search(target["expr"]))
            if source != "all" and dcgm != (source == "dcgm"):
                continue
            out.append(
                Query(
                    f"{panel['title']} [{target['refId']}]",
                    panel["type"],
                    target["expr"],
                    bool(target.get("exemplar")),
                )
            )
    return out


def query_variables(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """name -> the variable's query (``label_values(selector, label)``) for query variables."""
    out = {}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            out[var["name"]] = query["query"] if isinstance(query, dict) else str(query)
    return out


LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>[a-zA-Z_]\w*)\)$")


def parse_label_values(query: str) -> tuple[str | None, str]:
    """``label_values(metric{...}, label)`` -> (match selector or None, label)."""
    m = LABEL_VALUES.match(query.strip())
    if m is None:
        raise ValueError(f"not a label_values() variable query: {query!r}")
    return m.group("match"), m.group("label")


#: Grafana's built-in interval variables, as Grafana would fill them in over a 1 s scrape
BUILTINS = {"__rate_interval": "30s", "__interval": "5s", "__range": "5m", "__interval_ms": "5000"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$var``, ``${var}``, ``${var:fmt}``, ``[[var]]`` and Grafana's built-ins.

    A variable set to All is ``.*`` (the dashboard's allValue, used with ``=~``). An unknown
    variable is an error: the query would reach Prometheus with a literal ``$name`` in it.
    """

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTINS:
            return BUILTINS[name]
        if name not in values:
            raise KeyError(f"unknown dashboard variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(repl, expr)


def variables_in(expr: str) -> set[str]:
    names = {m.group(1) or m.group(2) or m.group(3) for m in _VARIABLE.finditer(expr)}
    return names - set(BUILTINS)


def alert_queries(path: Path = ALERTS) -> list[Query]:
    rules = yaml.safe_load(path.read_text("utf-8"))
    out = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            out.append(Query(f"alert {name}", "rule", rule["expr"]))
    return out


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise RuntimeError("prometheus is not installed (scripts/setup installs Debian's package)")
    return path


class PromQLError(Exception):
    """Prometheus answered a query with an error (bad PromQL, unknown function, ...)."""


class PrometheusServer:
    """``prometheus`` scraping ``targets`` (host:port) every ``scrape_interval`` as ``job``
    (``JOB`` unless told).

    ``rule_files`` are copied into the server's directory and loaded (evaluated every
    ``evaluation_interval``). ``labels`` are added to every target, like a real scrape config.
    """

    def __init__(
        self,
        targets: Sequence[str],
        *,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        rule_files: Sequence[Path] = (),
        labels: dict[str, str] | None = None,
        job: str = JOB,
    ) -> None:
        self.targets = list(targets)
        self.job = job
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.rule_files = list(rule_files)
        self.labels = labels or {}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> PrometheusServer:
        self._dir = tempfile.mkdtemp(prefix="prom-test-")
        root = Path(self._dir)
        rules = []
        for i, src in enumerate(self.rule_files):
            dst = root / f"rules-{i}-{src.name}"
            shutil.copyfile(src, dst)
            rules.append(dst.name)
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": rules,
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "metrics_path": "/metrics",
                    "static_configs": [{"targets": self.targets, "labels": self.labels}],
                }
            ],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self._log = open(root / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--enable-feature=exemplar-storage",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready after {STARTUP_TIMEOUT_S} s:\n{self.log()}")

    def stop(self) -> None:
        """SIGTERM by PID (SIGKILL after 10 s); removes the temp directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def log(self) -> str:
        if self._dir is None:
            return ""
        path = Path(self._dir) / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ HTTP API

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        """GET /api/v1/<path>; returns ``data``; raises :class:`PromQLError` on an error answer."""
        query = urllib.parse.urlencode(params, doseq=True)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400 bad_data, 422 execution errors
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query; returns the result vector (a scalar comes back as one sample)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    def exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api(
            "query_exemplars", query=expr, start=f"{start:.3f}", end=f"{end:.3f}"
        )
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = self.api(f"label/{label}/values", **{"match[]": [match]})
        return values

    def targets_health(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        return active

    def rules(self) -> list[dict[str, Any]]:
        groups = self.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def wait_for(
        self,
        what: str,
        check: Callable[[], bool],
        timeout: float = 15.0,
        interval: float = 0.2,
    ) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus: {what} not seen after {timeout} s:\n{self.log()}")
            time.sleep(interval)

    def wait_for_value(self, expr: str, want: float, timeout: float = 15.0) -> None:
        """Until the instant ``expr`` (one sample) equals ``want``: the scrapes have caught up."""

        def check() -> bool:
            result = self.query(expr)
            return len(result) == 1 and float(result[0]["value"][1]) == want

        self.wait_for(f"{expr} == {want}", check, timeout)


# ---------------------------------------------------------------- a dcgm-exporter stand-in

#: each series' HELP, as dcgm-exporter writes it
DCGM_HELP = {
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_PROF_SM_ACTIVE": "The ratio of cycles an SM has at least 1 warp assigned.",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "Ratio of cycles the tensor (HMMA) pipe is active.",
}


@dataclass
class Gpu:
    """One GPU as the stand-in reports it."""

    fb_used_mib: float
    fb_free_mib: float
    util_percent: float
    sm_active: float
    tensor_active: float
    model: str = "NVIDIA L4"


class DcgmExporter:
    """A stand-in for NVIDIA's dcgm-exporter: ``GET /metrics`` in its text format (its series
    names, HELP and labels) for the GPUs of one host, served from a thread on a free loopback
    port. ``gpus`` may be changed between scrapes."""

    def __init__(self, gpus: Sequence[Gpu], hostname: str = "gpu-node-1") -> None:
        self.gpus = list(gpus)
        self.hostname = hostname
        self.port = 0
        self._server: http.server.ThreadingHTTPServer | None = None

    def text(self) -> str:
        values = {
            "DCGM_FI_DEV_FB_USED": lambda g: g.fb_used_mib,
            "DCGM_FI_DEV_FB_FREE": lambda g: g.fb_free_mib,
            "DCGM_FI_DEV_GPU_UTIL": lambda g: g.util_percent,
            "DCGM_FI_PROF_SM_ACTIVE": lambda g: g.sm_active,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda g: g.tensor_active,
        }
        lines = []
        for name, value in values.items():
            lines += [f"# HELP {name} {DCGM_HELP[name]}", f"# TYPE {name} gauge"]
            for i, gpu in enumerate(self.gpus):
                labels = (
                    f'gpu="{i}",UUID="GPU-{i:08d}-0000-0000-0000-000000000000",'
                    f'pci_bus_id="00000000:00:{4 + i:02X}.0",device="nvidia{i}",'
                    f'modelName="{gpu.model}",Hostname="{self.hostname}",'
                    'DCGM_FI_DRIVER_VERSION="550.54.15"'
                )
                lines.append(f"{name}{{{labels}}} {value(gpu):g}")
        return "\n".join(lines) + "\n"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> DcgmExporter:
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.text().encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


# ---------------------------------------------------------------- evaluating them


def has_data(samples: Sequence[Mapping[str, Any]]) -> bool:
    """At least one sample with a finite value (histogram_quantile over no traffic is NaN)."""
    for sample in samples:
        value = float(sample["value"][1])
        if value == value and value not in (float("inf"), float("-inf")):
            return True
    return False


def evaluate(
    prom: PrometheusServer,
    queries: Sequence[Query],
    values: Mapping[str, str],
    at: float | None = None,
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Run every query (variables substituted); returns (results by ``where``, errors)."""
    results: dict[str, list[dict[str, Any]]] = {}
    errors: list[str] = []
    for q in queries:
        try:
            expr = substitute(q.expr, values)
            results[q.where] = prom.query(expr, at)
        except (PromQLError, KeyError) as exc:
            errors.append(f"{q.where}: {q.expr}\n    -> {exc}")
    return results, errors


def variable_values(
    prom: PrometheusServer, dashboard: Mapping[str, Any], all_values: Mapping[str, str]
) -> dict[str, list[str]]:
    """Each query variable's values, asked of Prometheus the way Grafana asks (label API)."""
    out = {}
    for name, query in query_variables(dashboard).items():
        match, label = parse_label_values(query)
        selector = substitute(match, all_values) if match else f'{{{label}!=""}}'
        out[name] = prom.label_values(label, selector)
    return out
