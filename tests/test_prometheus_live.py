"""A real Prometheus scrapes a live gateway; every dashboard and alert query is evaluated.

The gateway runs deploy/gateway/gateway.toml, the compose stack's own config, with only the
compose host names overridden by environment (GATEWAY__..., as an operator would) to point at
loopback servers of this test: `gateway mock-upstream`, a real redis-server and a real OTLP
receiver. Real traffic goes through it with the openai SDK (chat JSON, a stream with
stream_options.include_usage, embeddings, cache hits, a 5xx, 4xxs, with CDN/LB timing
headers), in three rounds so every counter and bucket has a rate. Then, through Prometheus's
HTTP API, every PromQL expression of the Grafana dashboard (variables substituted as Grafana
would) and of deploy/prometheus/alerts.yml must evaluate, and every dashboard query must return
data; exemplars must carry the trace_id that Grafana's Jaeger link uses, of a trace the
collector received.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import load_config
from tests.otlp_receiver import OTLPReceiver
from tests.prometheus_support import (
    ALERTS,
    CONTRACT,
    DATASOURCES,
    METRIC_NAME,
    ROOT,
    PrometheusServer,
    alert_queries,
    dashboard_queries,
    evaluate,
    has_data,
    load_dashboard,
    query_variables,
    series_names,
    substitute,
    variable_values,
    variables_in,
)
from tests.redis_support import RedisServer
from tests.support import (
    GatewayServer,
    Process,
    async_openai_client,
    free_port,
    gateway_cli,
    openai_client,
)

ROUNDS = 3
DEPLOY_CONFIG = ROOT / "deploy/gateway/gateway.toml"


@dataclass
class Stack:
    prom: PrometheusServer
    gateway: GatewayServer
    otlp: OTLPReceiver
    started: float


def _metrics_text(gw: GatewayServer) -> str:
    try:
        with urllib.request.urlopen(gw.url + "/metrics", timeout=5) as resp:
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        exc.close()
        raise AssertionError(f"GET /metrics answered {exc.code}: nothing to scrape") from None


def _requests_total(gw: GatewayServer) -> float:
    total = 0.0
    for family in text_string_to_metric_families(_metrics_text(gw)):
        if family.name in ("gateway_requests", "gateway_requests_total"):
            total += sum(s.value for s in family.samples if s.name == "gateway_requests_total")
    return total


def _edge_headers() -> dict[str, str]:
    # what a CDN and an LB in front would stamp (X-Request-Start conventions, SPEC §6)
    now = time.time()
    return {"x-cdn-start": f"t={now - 0.004:.6f}", "x-request-start": f"t={now - 0.002:.6f}"}


def _round(client: openai.OpenAI, gw: GatewayServer, n: int) -> None:
    # cacheable (temperature 0, same prompt every round): a miss, then hits
    client.chat.completions.create(
        model="mock-gpt-4o",
        messages=[{"role": "user", "content": "What is a gateway?"}],
        temperature=0,
        max_tokens=16,
        extra_headers=_edge_headers(),
    )
    # not cacheable: bypass
    client.chat.completions.create(
        model="mock-gpt-4o-mini",
        messages=[{"role": "user", "content": f"Tell me something new ({n})"}],
        max_tokens=16,
        extra_headers=_edge_headers(),
    )
    stream = client.chat.completions.create(
        model="mock-gpt-4o",
        messages=[{"role": "user", "content": f"Stream something ({n})"}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=_edge_headers(),
    )
    chunks = list(stream)
    assert chunks and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    client.embeddings.create(
        model="mock-embedding-3-small", input="the same text", extra_headers=_edge_headers()
    )
    # an upstream 503, passed through (route "default", backend mock-upstream)
    with pytest.raises(openai.APIStatusError) as failed:
        client.with_options(max_retries=0).chat.completions.create(
            model="mock-status-503", messages=[{"role": "user", "content": "fail"}]
        )
    assert failed.value.status_code == 503
    # a 4xx made by the gateway: the body is not JSON
    req = urllib.request.Request(
        gw.base_url + "/chat/completions",
        data=b"this is not json",
        headers={"content-type": "application/json", "authorization": "Bearer sk-client-key"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(req, timeout=5)
    assert bad.value.code == 400
    bad.value.close()  # an HTTPError holds the response's socket
    _mcp_round(gw)


def _mcp_round(gw: GatewayServer) -> None:
    """Tool calls through /mcp/builtin (docs/spec.md §23): one that works, one unknown tool."""
    url = gw.url + "/mcp/builtin"
    headers = {"authorization": "Bearer sk-client-key", "accept": "application/json"}
    for n, tool in enumerate(("echo", "no_such_tool")):
        call = {"name": tool, "arguments": {"text": "hi"}}
        body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": call}
        r = httpx2.post(url, json=body, headers=headers, timeout=5)
        assert r.status_code == 200, r.text
    # a message to the built-in agent (docs/spec.md §30)
    message = {"messageId": f"m{n}", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    body = {"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": {"message": message}}
    r = httpx2.post(gw.url + "/a2a/echo", json=body, headers=headers, timeout=5)
    assert r.status_code == 200 and "result" in r.json(), r.text
    # a realtime session (docs/spec.md §19): sessions, close codes, per-frame overhead
    asyncio.run(asyncio.wait_for(_realtime_turn(gw.base_url, n), 20))


async def _realtime_turn(base_url: str, n: int) -> None:
    client = async_openai_client(base_url, "sk-client-key")
    try:
        async with client.realtime.connect(model="mock-gpt-4o") as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"realtime round {n}"}],
                }
            )
            await conn.response.create()
            async for event in conn:
                if event.type == "response.done":
                    break
    finally:
        await client.close()


@pytest.fixture(scope="module")
def model_server() -> Iterator[Process]:
    """A capacity-limited mock serving /metrics: the "fleet" route's model servers."""
    port = free_port()
    proc = Process(gateway_cli("mock-upstream", "--port", str(port), "--capacity", "4"), port)
    yield proc
    proc.stop()


def _fleet_env(model_server: Process) -> dict[str, str]:
    """The deploy config's scraped backends (docs/spec.md §21) pointed at ``model_server``."""
    scraped = [
        i for i, b in enumerate(load_config(DEPLOY_CONFIG, env={}).backends) if b.metrics_url
    ]
    assert scraped
    env = {}
    for i in scraped:
        env[f"GATEWAY__BACKENDS__{i}__URL"] = model_server.url + "/v1"
        env[f"GATEWAY__BACKENDS__{i}__METRICS_URL"] = model_server.url + "/metrics"
    return env


@pytest.fixture(scope="module")
def stack(mock_upstream: Process, model_server: Process) -> Iterator[Stack]:
    with RedisServer() as redis, OTLPReceiver("http") as otlp:
        env = {
            **_fleet_env(model_server),
            "GATEWAY__SERVER__HOST": "127.0.0.1",  # GatewayServer picks a free port
            "GATEWAY__BACKENDS__0__URL": mock_upstream.url + "/v1",
            "GATEWAY__CACHE__URL": redis.url,
            "GATEWAY__TRACING__ENDPOINT": otlp.endpoint,
            "GATEWAY__TRACING__SCHEDULE_DELAY_MS": "100",
            "GATEWAY__LOGGING__ACCESS_LOG": "off",
            # keys on and a tenant budget, so the spend panels and the budget gauge have data
            # (the traffic's own key has none: its unpriced model is served and counted)
            "GATEWAY__AUTH__MODE": "keys",
            "GATEWAY__AUTH__KEYS__0__TENANT": "demo",
            "GATEWAY__AUTH__KEYS__0__SHA256": hashlib.sha256(b"sk-client-key").hexdigest(),
            "GATEWAY__AUTH__KEYS__0__MCP_SERVERS": '["builtin"]',  # the MCP row (§23)
            "GATEWAY__AUTH__KEYS__0__AGENTS": '["echo"]',  # the A2A row (§30)
            "GATEWAY__AUTH__TENANTS__0__NAME": "shared-budget",
            "GATEWAY__AUTH__TENANTS__0__BUDGET_USD": "100",
        }
        gw = GatewayServer(load_config(DEPLOY_CONFIG, env=env)).start()
        prom = PrometheusServer([f"127.0.0.1:{gw.port}"], rule_files=[ALERTS])
        try:
            prom.start()
            started = time.time()
            client = openai_client(gw.base_url, "sk-client-key")
            for n in range(ROUNDS):
                _round(client, gw, n)
                # every scrape from now on has at least this count: wait for one of them
                want = _requests_total(gw)
                prom.wait_for(
                    f"requests_total >= {want}",
                    lambda want=want: any(
                        float(s["value"][1]) >= want
                        for s in prom.query('sum(gateway_requests_total{job="llm-gateway"})')
                    ),
                )
            client.close()
            yield Stack(prom, gw, otlp, started)
        finally:
            prom.stop()
            gw.stop()


def _all_values() -> dict[str, str]:
    values = {name: ".*" for name in query_variables(load_dashboard())}
    values["datasource"] = "prometheus"
    return values


def test_prometheus_scrapes_the_gateway_and_sees_the_contract_metrics(stack: Stack) -> None:
    (target,) = stack.prom.targets_health()
    assert target["health"] == "up", target
    assert target["scrapeUrl"] == f"http://127.0.0.1:{stack.gateway.port}/metrics"
    scraped = set(stack.prom.label_values("__name__", '{__name__=~"gateway_.+"}'))
    assert series_names() <= scraped, sorted(series_names() - scraped)
    # labels as SPEC §11 lists them (plus the scrape's job/instance and the buckets' le)
    for name, (kind, labels) in CONTRACT.items():
        series = name + ("_count" if kind == "histogram" else "")
        found = stack.prom.api("series", **{"match[]": [series]})
        assert found, series
        for s in found:
            assert set(s) - {"__name__", "job", "instance"} == labels, (series, s)


def test_every_dashboard_query_evaluates_and_returns_data(stack: Stack) -> None:
    dashboard = load_dashboard()
    queries = dashboard_queries(dashboard)
    used = {m for q in queries for m in METRIC_NAME.findall(q.expr)}
    scraped = set(stack.prom.label_values("__name__", '{__name__=~"gateway_.+"}'))
    assert used <= scraped, sorted(used - scraped)
    results, errors = evaluate(stack.prom, queries, _all_values())
    assert not errors, "\n".join(errors)
    empty = [q.where + ": " + substitute(q.expr, _all_values()) for q in queries]
    empty = [line for q, line in zip(queries, empty, strict=True) if not has_data(results[q.where])]
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_dashboard_variables_have_values_and_each_selects_data(stack: Stack) -> None:
    """Each variable's label_values() finds values; picking one still gives data.

    A matcher on a misspelt label (`routes=~"$route"`) still matches with All (.*), so each
    variable is also set to each of its values in turn: some value must give data.
    """
    dashboard = load_dashboard()
    all_values = _all_values()
    values = variable_values(stack.prom, dashboard, all_values)
    assert all(values.values()), values
    assert f"127.0.0.1:{stack.gateway.port}" in values["instance"]
    assert {"chat", "embeddings", "default"} <= set(values["route"]), values["route"]
    cfg_hops = {h.name for h in load_config(DEPLOY_CONFIG, env={}).edge.hops}
    hops = {"intake", "auth", "router", "upstream"}
    assert cfg_hops | hops <= set(values["hop"]), values["hop"]
    failures = []
    for q in dashboard_queries(dashboard):
        for name in sorted(variables_in(q.expr) - {"datasource"}):
            picked = []
            for value in values[name]:
                # as Grafana formats a value for =~: regex-escaped, then PromQL-string-escaped
                chosen = {**all_values, name: re.escape(value).replace("\\", "\\\\")}
                results, errors = evaluate(stack.prom, [q], chosen)
                assert not errors, errors
                picked.append(has_data(results[q.where]))
            if not any(picked):
                failures.append(f"{q.where}: no data for any single ${name} of {values[name]}")
    assert not failures, "\n".join(failures)


def test_hop_chain_panels_show_every_hop_in_order(stack: Stack) -> None:
    dashboard = load_dashboard()
    (panel,) = [
        p for p in dashboard["panels"] if p.get("title", "").startswith("Hop p99, in chain order")
    ]
    seen: list[str] = []
    for target in panel["targets"]:
        expr = substitute(target["expr"], _all_values())
        seen += sorted(s["metric"]["hop"] for s in stack.prom.query(expr) if has_data([s]))
    assert seen == ["cdn", "lb", "intake", "auth", "router", "upstream"], seen


def test_every_alert_rule_evaluates_and_the_rule_manager_runs_them(stack: Stack) -> None:
    queries = alert_queries()
    _, errors = evaluate(stack.prom, queries, {})
    assert not errors, "\n".join(errors)

    # Prometheus's own rule manager loaded alerts.yml and evaluated every rule without error
    def evaluated() -> bool:
        rules = stack.prom.rules()
        return len(rules) == len(queries) and all(
            r["lastEvaluation"] > "2000" and r["health"] != "unknown" for r in rules
        )

    stack.prom.wait_for("every rule evaluated", evaluated, timeout=10)
    bad = [(r["name"], r["health"], r.get("lastError")) for r in stack.prom.rules()]
    bad = [b for b in bad if b[1] != "ok"]
    assert not bad, bad


def test_exemplars_carry_the_trace_id_that_grafana_links_to_jaeger(stack: Stack) -> None:
    datasources = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    (prometheus,) = [d for d in datasources if d["type"] == "prometheus"]
    (link,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    label = link["name"]
    now = time.time()
    found = stack.prom.exemplars(
        "gateway_request_duration_seconds_bucket", stack.started - 5, now + 5
    )
    exemplars: list[dict[str, Any]] = [e for series in found for e in series["exemplars"]]
    assert exemplars, "no exemplars on gateway_request_duration_seconds (OpenMetrics scrape)"
    trace_ids = {e["labels"].get(label) for e in exemplars}
    assert None not in trace_ids, exemplars
    assert all(re.fullmatch(r"[0-9a-f]{32}", t or "") for t in trace_ids), trace_ids
    # each one is a trace the collector received: the Jaeger link opens a real trace
    stack.otlp.wait_for(lambda spans: {s.trace_id for s in spans} >= trace_ids, timeout=10)
    # the other latency histograms the dashboard shows exemplars for carry the same label
    for metric in sorted(
        {
            m
            for q in dashboard_queries(load_dashboard())
            if q.exemplar
            for m in METRIC_NAME.findall(q.expr)
        }
    ):
        for series in stack.prom.exemplars(metric, stack.started - 5, now + 5):
            for e in series["exemplars"]:
                assert label in e["labels"], (metric, e)
