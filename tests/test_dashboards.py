"""The Grafana dashboard and the Prometheus rules, read and checked without a live gateway.

Every query names only SPEC §11 metrics (a crude PromQL reading: anything shaped like
``gateway_…``), the panels the issue asks for are there with the right groupings, exemplars
link to the provisioned Jaeger datasource, and promtool accepts the scrape config and the rules
and passes the rules' unit tests (deploy/prometheus/alerts_test.yml). The same queries are
evaluated by a real Prometheus over a live gateway in tests/test_prometheus_live.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus_support import (
    ALERTS,
    ALERTS_TEST,
    CONTRACT,
    DATASOURCES,
    DCGM,
    DCGM_NAME,
    METRIC_NAME,
    ROOT,
    DcgmExporter,
    Gpu,
    PrometheusServer,
    Query,
    alert_queries,
    dashboard_queries,
    evaluate,
    has_data,
    load_dashboard,
    panels,
    parse_label_values,
    query_variables,
    series_names,
    substitute,
    variables_in,
)

PROMETHEUS_DIR = ROOT / "deploy/prometheus"


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is not installed (scripts/setup installs Debian's prometheus package)"
    return path


def _all_queries() -> list[Query]:
    return dashboard_queries(load_dashboard(), "all") + alert_queries()


def _panel(title: str) -> dict[str, Any]:
    (found,) = [p for p in panels(load_dashboard()) if p["title"] == title]
    return found


def _exprs(title: str) -> list[str]:
    return [t["expr"] for t in _panel(title)["targets"]]


def _by(expr: str) -> set[str]:
    """Every label named in a ``by (...)`` or ``without (...)`` grouping of an expression."""
    return {
        lab.strip()
        for m in re.findall(r"\b(?:by|without) \(([^)]*)\)", expr)
        for lab in m.split(",")
        if lab.strip()
    }


# ---------------------------------------------------------------- metric names


def test_every_metric_name_in_dashboard_and_alerts_is_a_contract_series() -> None:
    allowed = series_names()
    unknown = {
        (q.where, name)
        for q in _all_queries()
        for name in METRIC_NAME.findall(q.expr)
        if name not in allowed
    }
    assert not unknown, sorted(unknown)


def test_the_contract_reading_catches_a_wrong_name() -> None:
    # the checker itself: a histogram used bare, a counter without _total, a made-up name
    for expr in (
        "rate(gateway_request_duration_seconds[5m])",
        "rate(gateway_requests[5m])",
        "gateway_latency_seconds_bucket",
    ):
        assert set(METRIC_NAME.findall(expr)) - series_names(), expr


def test_every_dcgm_name_is_one_dcgm_exporter_serves() -> None:
    used = {name for q in _all_queries() for name in DCGM_NAME.findall(q.expr)}
    assert used == set(DCGM), used ^ set(DCGM)  # the GPU row shows all five, nothing misspelt


def test_the_dashboard_shows_every_contract_metric() -> None:
    used = {
        name for q in dashboard_queries(load_dashboard()) for name in METRIC_NAME.findall(q.expr)
    }
    for name, (kind, _) in CONTRACT.items():
        variants = (
            {f"{name}_bucket", f"{name}_count", f"{name}_sum"} if kind == "histogram" else {name}
        )
        assert used & variants, f"no panel shows {name}"


def _base(series: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if series.endswith(suffix) and series.removesuffix(suffix) in CONTRACT:
            return series.removesuffix(suffix)
    return series


SELECTOR = re.compile(r"\b(gateway_[a-z_]+)\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*"')


def test_matchers_and_groupings_use_labels_the_metric_has() -> None:
    # `routes=~".*"` or `sum by (route)` over a metric without it fails silently in PromQL
    scrape = {"job", "instance"}
    for q in _all_queries():
        labels: set[str] = set()
        for series, matchers in SELECTOR.findall(q.expr):
            own = (
                CONTRACT[_base(series)][1]
                | scrape
                | ({"le"} if series.endswith("_bucket") else set())
            )
            used = set(MATCHER.findall(matchers))
            assert used <= own, (q.where, series, used - own)
            labels |= own
        for name in METRIC_NAME.findall(q.expr):
            labels |= CONTRACT[_base(name)][1] | scrape | {"le"}
        for name in DCGM_NAME.findall(q.expr):
            labels |= DCGM[name] | scrape
        assert _by(q.expr) <= labels, (q.where, _by(q.expr) - labels)


def test_the_label_reading_catches_a_misspelt_label() -> None:
    (series, matchers), *_ = SELECTOR.findall(
        'sum(rate(gateway_requests_total{routes=~"$route"}[1m]))'
    )
    assert set(MATCHER.findall(matchers)) - CONTRACT[_base(series)][1] == {"routes"}
    assert _by("sum by (route, le) (x)") == {"route", "le"}


# ---------------------------------------------------------------- dashboard model


def test_dashboard_is_a_grafana_model_with_unique_panels_and_refids() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "llm-gateway" and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    all_panels = list(panels(dashboard))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = Counter(p["title"] for p in all_panels)
    assert max(titles.values()) == 1, titles
    for panel in all_panels:
        assert panel["targets"], panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert target["expr"].strip()


def test_every_variable_a_query_uses_is_defined_and_substitutes() -> None:
    dashboard = load_dashboard()
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    values = {name: ".*" for name in defined}
    for q in dashboard_queries(dashboard, "all"):
        assert variables_in(q.expr) <= defined, q.where
        expr = substitute(q.expr, values)
        assert "$" not in expr and "[[" not in expr, (q.where, expr)
    with pytest.raises(KeyError):
        substitute('x{route=~"$nope"}', values)


def test_query_variables_are_label_values_of_contract_labels() -> None:
    dashboard = load_dashboard()
    variables = query_variables(dashboard)
    assert {"instance", "route", "model", "backend", "hop"} <= set(variables)
    for name, query in variables.items():
        match, label = parse_label_values(query)
        assert match is not None and METRIC_NAME.findall(match), name
        (metric,) = METRIC_NAME.findall(match)
        base = re.sub(r"_(bucket|count|sum)$", "", metric)
        assert label in CONTRACT[base if base in CONTRACT else metric][1] | {"instance"}, name
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert var["includeAll"] and var["allValue"] == ".*", var["name"]


def test_datasource_variable_defaults_to_the_provisioned_prometheus() -> None:
    dashboard = load_dashboard()
    (ds_var,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert ds_var["query"] == "prometheus"
    provisioned = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    by_uid = {d["uid"]: d for d in provisioned}
    assert by_uid[ds_var["current"]["value"]]["type"] == "prometheus"


# ---------------------------------------------------------------- the panels the issue names


def test_hop_latency_heatmap_is_repeated_per_hop_from_the_hop_buckets() -> None:
    heatmaps = [p for p in panels(load_dashboard()) if p["type"] == "heatmap"]
    (hop,) = [
        p for p in heatmaps if "gateway_hop_duration_seconds_bucket" in p["targets"][0]["expr"]
    ]
    assert hop["repeat"] == "hop"
    (target,) = hop["targets"]
    assert target["format"] == "heatmap" and _by(target["expr"]) == {"le"}
    assert 'hop=~"$hop"' in target["expr"]
    for p in heatmaps:
        assert p["options"]["calculate"] is False  # Prometheus buckets, not Grafana's own


def test_hop_bars_are_in_chain_order_edge_auth_router_upstream() -> None:
    for phi in ("50", "99"):
        exprs = _exprs(f"Hop p{phi}, in chain order")
        selectors = [re.search(r'hop(!~|=)"([^"]*)"', e).group(0) for e in exprs]  # type: ignore[union-attr]
        assert selectors == [
            'hop!~"intake|auth|router|upstream"',
            'hop="intake"',
            'hop="auth"',
            'hop="router"',
            'hop="upstream"',
        ]
        for e in exprs:
            assert e.startswith(f"histogram_quantile(0.{phi.rstrip('0') or '0'}")
            assert _by(e) == {"hop", "le"}


@pytest.mark.parametrize(
    ("title", "metric", "by", "quantiles"),
    [
        (
            "Request latency p50 / p90 / p99 by route",
            "gateway_request_duration_seconds",
            "route",
            ("0.5", "0.9", "0.99"),
        ),
        (
            "Gateway overhead p50 / p90 / p99 by route",
            "gateway_overhead_seconds",
            "route",
            ("0.5", "0.9", "0.99"),
        ),
        (
            "Upstream latency p50 / p99 by backend",
            "gateway_upstream_duration_seconds",
            "backend",
            ("0.5", "0.99"),
        ),
        (
            "Time to first token p50 / p99 by model",
            "gateway_time_to_first_token_seconds",
            "model",
            ("0.5", "0.99"),
        ),
    ],
)
def test_latency_panels_show_quantiles_by_their_label_with_exemplars(
    title: str, metric: str, by: str, quantiles: tuple[str, ...]
) -> None:
    panel = _panel(title)
    got = []
    for target in panel["targets"]:
        m = re.match(
            r"histogram_quantile\((0\.\d+), sum by \(([^)]*)\) \(rate\((\w+)\{", target["expr"]
        )
        assert m, target["expr"]
        got.append(m.group(1))
        assert {s.strip() for s in m.group(2).split(",")} == {by, "le"}
        assert m.group(3) == f"{metric}_bucket"
        assert "[$__rate_interval]" in target["expr"]
    assert tuple(got) == quantiles
    assert any(t["exemplar"] for t in panel["targets"]), "exemplars off"
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"


def test_tokens_errors_cache_inflight_and_backend_panels() -> None:
    (tokens,) = _exprs("Tokens/s by model and kind")
    assert "rate(gateway_tokens_total" in tokens and _by(tokens) == {"model", "kind"}
    (errors,) = _exprs("Errors/s by status code and type")
    assert "rate(gateway_errors_total" in errors and _by(errors) == {"status_code", "error_type"}
    for title in ("Cache hit ratio", "Cache hit ratio over time"):
        (ratio,) = _exprs(title)
        num, den = ratio.split(" / ")
        assert 'result="hit"' in num and 'result=~"hit|miss"' in den
    (inflight,) = _exprs("In flight by route")
    assert "gateway_inflight_requests" in inflight and _by(inflight) == {"route"}
    (up,) = _exprs("Backend in rotation")
    assert "gateway_backend_up" in up and _by(up) == {"backend"}


def test_exemplars_link_to_the_provisioned_jaeger_by_trace_id() -> None:
    provisioned = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    (prom,) = [d for d in provisioned if d["type"] == "prometheus"]
    (jaeger,) = [d for d in provisioned if d["type"] == "jaeger"]
    (link,) = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {**link, "name": "trace_id", "datasourceUid": jaeger["uid"]}
    exemplar_metrics = {
        m
        for q in dashboard_queries(load_dashboard())
        if q.exemplar
        for m in METRIC_NAME.findall(q.expr)
    }
    assert {
        "gateway_request_duration_seconds_bucket",
        "gateway_overhead_seconds_bucket",
        "gateway_upstream_duration_seconds_bucket",
        "gateway_time_to_first_token_seconds_bucket",
    } <= exemplar_metrics


# ---------------------------------------------------------------- Prometheus rules and config


def test_alerts_cover_what_the_issue_names_and_each_has_a_firing_unit_test() -> None:
    names = [q.where.removeprefix("alert ") for q in alert_queries()]
    for wanted in (
        "LatencyP99",
        "ErrorRatio",
        "CacheMissSurge",
        "OverheadRegression",
        "BackendDown",
    ):
        assert any(wanted in n for n in names), wanted
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    firing = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    silent = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if not case.get("exp_alerts")
    }
    assert set(names) <= firing, set(names) - firing
    # each test case feeds healthy series beside the bad ones (or checks a silent time)
    for test in tests["tests"]:
        for case in test.get("alert_rule_test", []):
            expected = len(case.get("exp_alerts") or [])
            assert expected < max(2, len(test["input_series"])), test["name"]
    assert silent, "no alert is ever asserted silent"
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_promtool_check_rules() -> None:
    out = subprocess.run(
        [_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alert_queries())} rules found" in out.stdout


def test_promtool_test_rules() -> None:
    out = subprocess.run(
        [_promtool(), "test", "rules", ALERTS_TEST.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROMETHEUS_DIR,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_test_rules_fails_when_a_threshold_moves(tmp_path: Path) -> None:
    # the unit tests can fail: double the latency threshold and the firing case must break
    text = ALERTS.read_text()
    moved = text.replace(") > 20\n", ") > 40\n")
    assert moved != text
    (tmp_path / "alerts.yml").write_text(moved)
    shutil.copyfile(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    out = subprocess.run(
        [_promtool(), "test", "rules", ALERTS_TEST.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert "GatewayRequestLatencyP99High" in out.stdout + out.stderr


def test_promtool_check_config_of_the_compose_prometheus() -> None:
    out = subprocess.run(
        [_promtool(), "check", "config", "prometheus.yml"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=PROMETHEUS_DIR,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_test_rules_fails_when_a_gpu_threshold_moves(tmp_path: Path) -> None:
    text = ALERTS.read_text()
    moved = text.replace("\n          ) >= 0.85\n", "\n          ) >= 0.95\n")
    moved = moved.replace("< 2048)", "< 512)")
    assert moved.count(">= 0.95") == 1 and moved.count("< 512)") == 1
    (tmp_path / "alerts.yml").write_text(moved)
    shutil.copyfile(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    out = subprocess.run(
        [_promtool(), "test", "rules", ALERTS_TEST.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert "GpuMemoryNearlyFull" in out.stdout + out.stderr
    assert "GpuMemoryFreeLow" in out.stdout + out.stderr


# ---------------------------------------------------------------- the GPUs row (dcgm-exporter)


def _gpu_row() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    top = load_dashboard()["panels"]
    (i,) = [i for i, p in enumerate(top) if p["type"] == "row" and p["title"].startswith("GPUs")]
    after = top[i + 1 :]
    end = next((j for j, p in enumerate(after) if p["type"] == "row"), len(after))
    return top[i], after[:end]


def test_the_gpu_row_shows_memory_and_activity_per_gpu() -> None:
    row, gpu_panels = _gpu_row()
    assert not row["collapsed"]
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in gpu_panels}
    assert set(exprs) == {
        "GPU memory used ÷ total",
        "GPU memory free",
        "GPU utilization",
        "SM and tensor-core activity",
    }
    (used,) = exprs["GPU memory used ÷ total"]
    assert "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)" in used
    (free,) = exprs["GPU memory free"]
    assert "DCGM_FI_DEV_FB_FREE" in free and free.endswith("* 1024 * 1024")  # MiB -> bytes
    for title, queries in exprs.items():
        for expr in queries:
            assert _by(expr) == {"Hostname", "gpu"}, (title, expr)  # one line per GPU
    assert [q.where for q in dashboard_queries(load_dashboard(), "dcgm")] == [
        f"{p['title']} [{t['refId']}]" for p in gpu_panels for t in p["targets"]
    ]


GPUS = [
    # gpu 0: 72 of 80 GiB used (90 %), 8 GiB free; gpu 1: 30 of 80 GiB (37.5 %)
    Gpu(73728, 8192, 97, 0.81, 0.42, "NVIDIA A100-SXM4-80GB"),
    Gpu(30720, 51200, 12, 0.1, 0.02, "NVIDIA A100-SXM4-80GB"),
]


def test_the_gpu_row_and_alerts_evaluate_against_a_dcgm_exporter_stand_in() -> None:
    """A real Prometheus scrapes a stand-in that speaks dcgm-exporter's format, as the job
    ``dcgm-exporter`` of deploy/prometheus; every query of the GPU row gives each GPU's value,
    and the alert expressions pick the right GPU."""
    with (
        DcgmExporter(GPUS) as exporter,
        PrometheusServer([exporter.target], job="dcgm-exporter", rule_files=[ALERTS]) as prom,
    ):
        prom.wait_for_value('count(DCGM_FI_DEV_FB_USED{job="dcgm-exporter"})', 2)
        queries = dashboard_queries(load_dashboard(), "dcgm")
        results, errors = evaluate(prom, queries, {"datasource": "prometheus"})
        assert not errors, "\n".join(errors)

        def per_gpu(where: str) -> dict[str, float]:
            assert has_data(results[where]), where
            return {s["metric"]["gpu"]: float(s["value"][1]) for s in results[where]}

        assert per_gpu("GPU memory used ÷ total [A]") == {"0": 0.9, "1": 0.375}
        assert per_gpu("GPU memory free [A]") == {"0": 8 * 2**30, "1": 50 * 2**30}
        assert per_gpu("GPU utilization [A]") == {"0": 97.0, "1": 12.0}
        assert per_gpu("SM and tensor-core activity [A]") == {"0": 0.81, "1": 0.1}
        assert per_gpu("SM and tensor-core activity [B]") == {"0": 0.42, "1": 0.02}
        (nearly_full,) = [q for q in alert_queries() if q.where == "alert GpuMemoryNearlyFull"]
        firing = prom.query(nearly_full.expr)
        assert [(s["metric"]["gpu"], s["metric"]["job"]) for s in firing] == [
            ("0", "dcgm-exporter")
        ]
        # free < 2 GiB somewhere, but no model server's queue is scraped: silent
        exporter.gpus[1] = Gpu(80000, 1024, 99, 0.9, 0.5, "NVIDIA A100-SXM4-80GB")
        prom.wait_for_value('min(DCGM_FI_DEV_FB_FREE{job="dcgm-exporter"})', 1024)
        (free_low,) = [q for q in alert_queries() if q.where == "alert GpuMemoryFreeLow"]
        assert prom.query(free_low.expr) == []
        low = free_low.expr.split(" and on ")[0]
        assert [s["metric"]["gpu"] for s in prom.query(low)] == ["1"]
