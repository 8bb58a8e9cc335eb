"""GET /metrics (SPEC §11) over real sockets: every metric, its labels, counts and token sums."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Config
from gateway.telemetry.metrics import DURATION_BUCKETS, FINE_BUCKETS
from tests.support import (
    GatewayServer,
    Process,
    free_port,
    gateway_cli,
    gateway_config,
    openai_client,
)

MSG = [{"role": "user", "content": "count me"}]


def config(mock_url: str, extra: str = "") -> Config:
    return gateway_config(
        f"""
[[backends]]
name = "mock"
url = "{mock_url}/v1"

[[routes]]
name = "gpt"
models = ["mock-gpt-4o", "mock-cut-*", "mock-status-*"]
backends = ["mock"]

[cache]
backend = "memory"

[edge]
trusted_proxies = ["127.0.0.1/32"]
[[edge.hops]]
name = "lb"
header = "x-request-start"
{extra}
"""
    )


def scrape(gw: GatewayServer, accept: str | None = None) -> tuple[str, str]:
    headers = {"accept": accept} if accept else {}
    r = httpx2.get(gw.url + "/metrics", headers=headers, timeout=10, trust_env=False)
    assert r.status_code == 200
    return r.headers["content-type"], r.text


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(got: dict, name: str, **labels: str) -> float:
    return got.get((name, frozenset(labels.items())), 0.0)


def label_sets(got: dict, name: str) -> Iterator[dict[str, str]]:
    for (n, labels), _ in got.items():
        if n == name:
            yield dict(labels)


@pytest.fixture
def traffic(gateway, mock_upstream) -> tuple[GatewayServer, dict[str, Any]]:
    gw = gateway(config(mock_upstream.url))
    client = openai_client(gw.base_url, "sk-metrics")
    facts: dict[str, Any] = {}
    # JSON, twice: the second is a cache hit (temperature 0 is deterministic)
    for _ in range(2):
        answer = client.chat.completions.create(
            model="mock-gpt-4o", messages=MSG, temperature=0, max_tokens=5
        )
    facts["json_usage"] = answer.usage
    # a stream with usage, from a trusted LB that stamped X-Request-Start
    import time

    stream = client.chat.completions.create(
        model="mock-gpt-4o",
        messages=MSG,
        stream=True,
        max_tokens=7,
        stream_options={"include_usage": True},
        extra_headers={"x-request-start": f"t={time.time() - 0.01:.6f}"},
    )
    chunks = list(stream)
    facts["stream_usage"] = chunks[-1].usage
    # a cut stream: the SDK raises
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="mock-cut-2", messages=MSG, stream=True))
    # an upstream 4xx passed through, and a gateway 4xx (no route)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="mock-status-400", messages=MSG)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MSG)
    return gw, facts


def test_every_spec_metric_with_its_labels_counts_and_token_sums(traffic):
    gw, facts = traffic
    content_type, text = scrape(gw)
    assert content_type.startswith("text/plain; version=0.0.4")
    got = samples(text)
    # gateway_requests_total{route, model, status_code}
    assert (
        value(got, "gateway_requests_total", route="gpt", model="mock-gpt-4o", status_code="200")
        == 3
    )
    assert (
        value(got, "gateway_requests_total", route="gpt", model="mock-cut-2", status_code="200")
        == 1
    )
    assert (
        value(got, "gateway_requests_total", route="gpt", model="mock-status-*", status_code="400")
        == 1
    )
    # the client's unknown model never becomes a label value
    assert value(got, "gateway_requests_total", route="none", model="other", status_code="404") == 1
    assert not any("no-such-model" in str(k) for k in got)
    # tokens: the JSON answer (once: the hit replays the same usage) + the hit + the stream
    ju, su = facts["json_usage"], facts["stream_usage"]
    assert value(got, "gateway_tokens_total", model="mock-gpt-4o", kind="input") == (
        2 * ju.prompt_tokens + su.prompt_tokens
    )
    assert value(got, "gateway_tokens_total", model="mock-gpt-4o", kind="output") == (
        2 * ju.completion_tokens + su.completion_tokens
    )
    # errors by status and type
    assert (
        value(
            got, "gateway_errors_total", status_code="200", error_type="upstream_stream_truncated"
        )
        == 1
    )
    assert value(got, "gateway_errors_total", status_code="404", error_type="model_not_found") == 1
    assert (
        value(got, "gateway_errors_total", status_code="400", error_type="upstream_client_error")
        == 1
    )
    # cache: miss, hit, and bypass for the non-deterministic ones
    assert value(got, "gateway_cache_requests_total", result="hit") == 1
    assert value(got, "gateway_cache_requests_total", result="miss") == 1
    assert value(got, "gateway_cache_requests_total", result="bypass") == 3
    # histograms: counts agree with the requests
    assert (
        value(got, "gateway_request_duration_seconds_count", route="gpt", model="mock-gpt-4o") == 3
    )
    assert value(got, "gateway_overhead_seconds_count", route="gpt") == 5
    assert (
        value(got, "gateway_upstream_duration_seconds_count", backend="mock", model="mock-gpt-4o")
        == 2
    )
    assert value(got, "gateway_time_to_first_token_seconds_count", model="mock-gpt-4o") == 1
    assert value(got, "gateway_hop_duration_seconds_count", hop="lb") == 1
    assert value(got, "gateway_hop_duration_seconds_count", hop="auth") == 6
    assert value(got, "gateway_hop_duration_seconds_count", hop="router") >= 5
    assert value(got, "gateway_hop_duration_seconds_count", hop="upstream") == 4
    # buckets: the SPEC's bounds, cumulative, +Inf == count
    les = {
        float(ls["le"])
        for ls in label_sets(got, "gateway_request_duration_seconds_bucket")
        if ls["le"] != "+Inf"
    }
    assert les == set(DURATION_BUCKETS) and {0.1, 0.25, 0.5, 1, 2.5, 5, 10} <= les
    fine = {
        float(ls["le"])
        for ls in label_sets(got, "gateway_hop_duration_seconds_bucket")
        if ls["le"] != "+Inf"
    }
    assert fine == set(FINE_BUCKETS) and min(fine) == 0.0001
    inf = value(got, "gateway_overhead_seconds_bucket", route="gpt", le="+Inf")
    assert inf == value(got, "gateway_overhead_seconds_count", route="gpt")
    # gauges: nothing in flight now; the backend is in rotation; limits are not in fallback
    assert value(got, "gateway_inflight_requests", route="gpt") == 0
    assert value(got, "gateway_backend_up", backend="mock") == 1
    assert value(got, "gateway_ratelimit_fallback") == 0


def test_exemplars_with_trace_ids_in_openmetrics_only(gateway, mock_upstream):
    gw = gateway(
        config(
            mock_upstream.url,
            '[tracing]\nexporter = "otlp"\nendpoint = "http://127.0.0.1:9"\n',
        )
    )
    r = httpx2.post(
        gw.base_url + "/chat/completions",
        json={"model": "mock-gpt-4o", "messages": MSG},
        timeout=10,
        trust_env=False,
    )
    trace_id = r.headers["traceresponse"].split("-")[1]
    content_type, text = scrape(gw, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    exemplars = [
        (fam.name, s.exemplar)
        for fam in parse_om(text)
        for s in fam.samples
        if s.exemplar is not None
    ]
    names = {n for n, _ in exemplars}
    assert {
        "gateway_request_duration_seconds",
        "gateway_overhead_seconds",
        "gateway_upstream_duration_seconds",
    } <= names
    assert all(ex.labels["trace_id"] == trace_id for _, ex in exemplars)
    assert all(math.isfinite(ex.value) and ex.value >= 0 for _, ex in exemplars)
    _, plain = scrape(gw)
    assert "trace_id" not in plain  # the text format has no exemplars


def test_inflight_counts_a_stream_while_it_runs(gateway, mock_upstream):
    gw = gateway(config(mock_upstream.url))
    with (
        httpx2.Client(timeout=10, trust_env=False) as client,
        client.stream(
            "POST",
            gw.base_url + "/chat/completions",
            json={"model": "mock-gpt-4o", "messages": MSG, "stream": True, "max_tokens": 20},
            headers={"x-mock-tokens-per-s": "20"},
        ) as resp,
    ):
        chunks = resp.iter_raw()
        next(chunks)  # the stream has started
        during = samples(scrape(gw)[1])
        for _ in chunks:
            pass
    after = samples(scrape(gw)[1])
    assert value(during, "gateway_inflight_requests", route="gpt") == 1
    assert value(after, "gateway_inflight_requests", route="gpt") == 0


def test_metrics_disabled_removes_the_endpoint(gateway, mock_upstream):
    gw = gateway(config(mock_upstream.url, "[metrics]\nenabled = false\n"))
    r = httpx2.get(gw.url + "/metrics", timeout=10, trust_env=False)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert gw.app.runtime is not None and gw.app.runtime.telemetry.metrics is None


def test_workers_2_every_scrape_gives_the_totals_of_all_workers(tmp_path):
    """One port, two worker processes: whichever answers /metrics reports both workers' counts."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        """
[[backends]]
name = "mock"
url = "mock://"
[[routes]]
name = "all"
models = ["*"]
backends = ["mock"]
[logging]
access_log = "off"
"""
    )
    port = free_port()
    proc = Process(
        gateway_cli("serve", "-c", str(config), "--port", str(port), "--workers", "2"), port
    )
    try:
        base = f"http://127.0.0.1:{port}"
        sent = 40
        for _ in range(sent):  # a new connection each: the kernel spreads them over the workers
            with httpx2.Client(timeout=10, trust_env=False) as client:
                r = client.post(
                    base + "/v1/chat/completions",
                    json={"model": "mock-gpt-4o", "messages": MSG},
                    headers={"connection": "close"},
                )
                assert r.status_code == 200
        time.sleep(1.5)  # every worker has written its snapshot since
        totals = []
        for _ in range(8):
            with httpx2.Client(timeout=10, trust_env=False) as client:
                got = samples(client.get(base + "/metrics", headers={"connection": "close"}).text)
            totals.append(
                value(
                    got,
                    "gateway_requests_total",
                    route="all",
                    model="mock-gpt-4o",
                    status_code="200",
                )
            )
    finally:
        proc.stop()
    assert totals == [float(sent)] * len(totals), totals
