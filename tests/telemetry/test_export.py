"""The OTLP exporters against a real OTLP receiver (HTTP and gRPC) that decodes the protobuf.

The batches are built with :mod:`gateway.telemetry.otlp` exactly as the gateway builds them; the
``OTEL_EXPORTER_OTLP_*`` variables are handed to :func:`make_exporter` as an explicit mapping
(no test changes the process environment), except in the subprocesses that check the import
side (grpc missing, no OTel exporter package needed at run time).
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from gateway.config import TracingConfig
from gateway.telemetry import otlp
from gateway.telemetry.export import (
    ConsoleExporter,
    EncodedBatch,
    ExportConfigError,
    FailureLog,
    GRPCExporter,
    HTTPExporter,
    OTLPSettings,
    SpanQueue,
    make_exporter,
    parse_headers,
    resolve_settings,
)
from tests.otlp_receiver import BlackHole, OTLPReceiver

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = ["http", "grpc"]
OTLP_PROTOCOL = {"http": "http/protobuf", "grpc": "grpc"}
ENCODER = otlp.RequestEncoder({"service.name": "export-test", "k8s.pod.name": "p-1"}, "gw", "9.9")
T0 = 1_700_000_000_000_000_000


def encoded_span(name: str, index: int = 0) -> bytes:
    return otlp.span(
        trace_id=bytes([index + 1]) * 16,
        span_id=bytes([index + 1]) * 8,
        parent_span_id=None if index == 0 else b"\x01" * 8,
        name=name,
        kind=otlp.KIND_SERVER if index == 0 else otlp.KIND_CLIENT,
        start_ns=T0 + index,
        end_ns=T0 + 1_000_000 + index,
        attributes=[otlp.attr("gateway.route", "gpt"), otlp.attr("http.response.status_code", 200)],
    )


def batch(*names: str) -> EncodedBatch:
    spans = [encoded_span(n, i) for i, n in enumerate(names)]
    return EncodedBatch(ENCODER.request(spans), len(spans))


def otlp_config(protocol: str = "http", **kwargs: Any) -> TracingConfig:
    if protocol in OTLP_PROTOCOL:
        protocol = OTLP_PROTOCOL[protocol]
    return TracingConfig(exporter="otlp", protocol=protocol, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def receiver() -> Iterator[Callable[..., OTLPReceiver]]:
    started: list[OTLPReceiver] = []

    def start(protocol: Literal["http", "grpc"] = "http", **kwargs: Any) -> OTLPReceiver:
        r = OTLPReceiver(protocol, **kwargs).start()
        started.append(r)
        return r

    yield start
    for r in reversed(started):
        r.stop()


@pytest.fixture
def exporters() -> Iterator[Callable[..., Any]]:
    """make_exporter(), with every exporter made shut down at the end."""
    made: list[Any] = []

    def make(cfg: TracingConfig, env: dict[str, str] | None = None) -> Any:
        exporter = make_exporter(cfg, env or {})
        made.append(exporter)
        return exporter

    yield make
    for e in made:
        e.shutdown()


def export_ok(exporter: Any, rec: OTLPReceiver, *names: str) -> None:
    """The batch is accepted and the receiver decoded exactly those spans."""
    assert exporter.export(batch(*names)) is True, rec.dump()
    spans = rec.wait_for_spans(len(names))
    assert [s.name for s in spans] == list(names)
    root = spans[0]
    assert root.trace_id == "01" * 16
    assert root.span_id == "01" * 8
    assert root.kind == "SERVER"
    assert root.attributes == {"gateway.route": "gpt", "http.response.status_code": 200}
    assert root.resource == {"service.name": "export-test", "k8s.pod.name": "p-1"}
    assert (root.scope_name, root.scope_version) == ("gw", "9.9")
    assert (root.start_ns, root.end_ns) == (T0, T0 + 1_000_000)


# ---------------------------------------------------------------- endpoint


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_otel_exporter_otlp_endpoint(receiver, exporters, protocol):
    rec = receiver(protocol)
    exporter = exporters(otlp_config(protocol), {"OTEL_EXPORTER_OTLP_ENDPOINT": rec.endpoint})
    export_ok(exporter, rec, "root", "child")
    assert rec.errors == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_traces_endpoint_wins_over_the_generic_one(receiver, exporters, protocol):
    rec = receiver(protocol)
    other = receiver(protocol)
    traces = rec.traces_url if protocol == "http" else rec.endpoint
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces,
        "OTEL_EXPORTER_OTLP_ENDPOINT": other.endpoint,
    }
    export_ok(exporters(otlp_config(protocol), env), rec, "root")
    assert other.export_requests == 0


def test_http_traces_endpoint_is_used_as_is_and_the_base_gets_v1_traces(receiver, exporters):
    rec = receiver("http")
    as_is = exporters(otlp_config(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rec.endpoint + "/x"})
    assert as_is.export(batch("a")) is False  # the receiver serves /v1/traces only
    base = exporters(otlp_config(), {"OTEL_EXPORTER_OTLP_ENDPOINT": rec.endpoint + "/pre/"})
    assert base.export(batch("a")) is False
    assert rec.errors == ["POST /x: not /v1/traces", "POST /pre/v1/traces: not /v1/traces"]
    assert rec.spans == []


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_config_endpoint_wins_over_otel_env(receiver, exporters, protocol):
    chosen = receiver(protocol)
    env_one = receiver(protocol)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": env_one.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": env_one.endpoint,
    }
    exporter = exporters(otlp_config(protocol, endpoint=chosen.endpoint), env)
    export_ok(exporter, chosen, "root")
    assert env_one.export_requests == 0


def test_endpoint_shown_without_credentials_and_userinfo_sent_as_basic_auth(receiver, exporters):
    rec = receiver("http")
    url = rec.endpoint.replace("http://", "http://ops:pa%20ss@") + "/v1/traces?token=t0ps3cret"
    exporter = exporters(otlp_config(endpoint=url))
    assert exporter.endpoint == rec.traces_url
    assert "t0ps3cret" not in exporter.endpoint and "ops" not in exporter.endpoint
    # the query is part of the request target, so this receiver refuses it; what matters is
    # what was sent
    exporter.export(batch("a"))
    (headers,) = rec.request_headers
    assert headers["authorization"] == "Basic " + base64.b64encode(b"ops:pa ss").decode()


# ---------------------------------------------------------------- protocol


@pytest.mark.parametrize(
    ("config_protocol", "env", "expected"),
    [
        ("http/protobuf", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
        (
            "http/protobuf",
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "http",
        ),
        ("grpc", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "grpc"),  # explicit config wins
        ("http/protobuf", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http"),  # unsupported
    ],
    ids=["env-grpc", "traces-wins", "config-wins", "unsupported-ignored"],
)
def test_protocol(receiver, exporters, config_protocol, env, expected):
    rec = receiver(expected)
    exporter = exporters(
        otlp_config(config_protocol), {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": rec.endpoint}
    )
    assert isinstance(exporter, GRPCExporter if expected == "grpc" else HTTPExporter)
    export_ok(exporter, rec, "root")


# ---------------------------------------------------------------- headers


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_headers_url_decoded_and_traces_headers_win(receiver, exporters, protocol, caplog):
    rec = receiver(protocol)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": rec.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-generic=1",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": (
            "Api-Key=s3cr%3Dt%2C%20x , x-tenant=team%20a,broken-s3cr3t"
        ),
    }
    with caplog.at_level(logging.DEBUG, "gateway.tracing"):
        exporter = exporters(otlp_config(protocol), env)
        export_ok(exporter, rec, "root")
    (headers,) = rec.request_headers
    assert headers["api-key"] == "s3cr=t, x"
    assert headers["x-tenant"] == "team a"
    assert "x-generic" not in headers  # the per-signal variable replaces the generic one
    assert headers["user-agent"].startswith("llm-gateway/")
    assert [r.getMessage() for r in caplog.records] == [
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS: entry 3 is not a valid name=value header; ignored"
    ]


def test_header_values_never_logged_even_when_export_fails(exporters, caplog):
    dead = OTLPReceiver("http")  # never started: its port is closed
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20sk-very-secret"}
    with caplog.at_level(logging.DEBUG, "gateway.tracing"):
        exporter = exporters(otlp_config(endpoint=dead.endpoint, export_timeout_s=0.3), env)
        assert exporter.export(batch("a")) is False
    assert caplog.records, "the failure is logged"
    assert all("sk-very-secret" not in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a=1,b=2", (("a", "1"), ("b", "2"))),
        (" a = 1 ,, B=x%20y ", (("a", "1"), ("b", "x y"))),
        ("k=v=w", (("k", "v=w"),)),
        ("k=", (("k", ""),)),
        ("noequals,=v,bad name=1,ok=1", (("ok", "1"),)),
        ("k=line%0Abreak,ok=%E2%9C%93", ()),  # CR/LF and non-ASCII would break the request
        ("", ()),
    ],
)
def test_parse_headers(value, expected):
    assert parse_headers(value, "OTEL_EXPORTER_OTLP_HEADERS") == expected


# ---------------------------------------------------------------- timeout


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_timeout_env_is_milliseconds(exporters, protocol):
    with BlackHole() as hole:
        env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "300"}  # 300 ms; read as seconds it would hang
        exporter = exporters(otlp_config(protocol, endpoint=hole.endpoint), env)
        started = time.monotonic()
        assert exporter.export(batch("a")) is False
        elapsed = time.monotonic() - started
        assert hole.connections >= 1
    assert 0.25 <= elapsed < 3.0  # neither 300 s nor the 5 s default


def test_traces_timeout_wins_and_explicit_config_timeout_wins_over_both(exporters):
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "60000", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "200"}
    assert resolve_settings(otlp_config(), env).timeout_s == 0.2
    assert resolve_settings(otlp_config(export_timeout_s=1.5), env).timeout_s == 1.5
    with BlackHole() as hole:
        exporter = exporters(otlp_config(endpoint=hole.endpoint, export_timeout_s=1.0), env)
        started = time.monotonic()
        assert exporter.export(batch("a")) is False
        assert time.monotonic() - started >= 0.95  # the config's 1 s, not the env's 0.2 s


# ---------------------------------------------------------------- compression


def test_http_gzip_bodies(receiver, exporters):
    rec = receiver("http")
    names = [f"span-{i}" for i in range(50)]
    plain = exporters(otlp_config(endpoint=rec.endpoint))
    gz = exporters(otlp_config(endpoint=rec.endpoint), {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
    export_ok(plain, rec, *names)
    rec.clear()
    export_ok(gz, rec, *names)
    (plain_size,) = [len(batch(*names).data)]
    (gz_size,) = rec.body_sizes
    assert rec.request_headers[0]["content-encoding"] == "gzip"
    assert gz_size < plain_size / 3  # really compressed, not just labelled


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_gzip_compression_is_what_the_receiver_sees(receiver, exporters, protocol):
    # a receiver that refuses gzip proves the exporter sent gzip (grpc-python hides the
    # message encoding from the servicer)
    rec = receiver(protocol, accept_gzip=False)
    gz = exporters(
        otlp_config(protocol, endpoint=rec.endpoint),
        {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip"},
    )
    assert gz.export(batch("a")) is False
    assert rec.export_requests == 1 or protocol == "grpc"
    none = exporters(
        otlp_config(protocol, endpoint=rec.endpoint), {"OTEL_EXPORTER_OTLP_COMPRESSION": "none"}
    )
    export_ok(none, rec, "a")
    accepting = receiver(protocol)
    gz2 = exporters(
        otlp_config(protocol, endpoint=accepting.endpoint),
        {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"},
    )
    export_ok(gz2, accepting, "a")


# ---------------------------------------------------------------- TLS


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tls_with_a_self_signed_ca_via_otel_exporter_otlp_certificate(
    receiver, exporters, protocol
):
    rec = receiver(protocol, tls=True)
    assert rec.endpoint.startswith("https://")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": rec.endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "2000"}
    untrusted = exporters(otlp_config(protocol), env)
    assert untrusted.export(batch("a")) is False  # the system trust store does not know it
    assert rec.spans == []
    trusting = exporters(
        otlp_config(protocol), {**env, "OTEL_EXPORTER_OTLP_CERTIFICATE": rec.ca_file}
    )
    export_ok(trusting, rec, "a")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mutual_tls_with_client_key_and_certificate(receiver, exporters, protocol):
    rec = receiver(protocol, tls=True, client_auth=True)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": rec.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": rec.ca_file,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1500",
    }
    anonymous = exporters(otlp_config(protocol), env)
    assert anonymous.export(batch("a")) is False
    client = {
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": rec.client_key_file,
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": rec.client_cert_file,
    }
    export_ok(exporters(otlp_config(protocol), {**env, **client}), rec, "a")


def test_grpc_without_scheme_uses_otel_exporter_otlp_insecure(receiver, exporters):
    plain = receiver("grpc")
    target = plain.endpoint.removeprefix("http://")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": target, "OTEL_EXPORTER_OTLP_TIMEOUT": "1500"}
    tls_by_default = exporters(otlp_config("grpc"), env)
    assert tls_by_default.endpoint == f"https://{target}"
    assert tls_by_default.export(batch("a")) is False
    insecure = exporters(otlp_config("grpc"), {**env, "OTEL_EXPORTER_OTLP_INSECURE": "true"})
    assert insecure.endpoint == f"http://{target}"
    export_ok(insecure, plain, "a")


def test_unreadable_certificate_or_half_a_client_pair_is_a_clear_error(tmp_path):
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(
        ExportConfigError, match=r"OTEL_EXPORTER_OTLP_CERTIFICATE: .*not a readable"
    ):
        make_exporter(otlp_config(), {"OTEL_EXPORTER_OTLP_CERTIFICATE": missing})
    key = tmp_path / "k.pem"
    key.write_text("x")
    with pytest.raises(ExportConfigError, match="mutual TLS needs both"):
        make_exporter(otlp_config(), {"OTEL_EXPORTER_OTLP_CLIENT_KEY": str(key)})
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ExportConfigError, match="cannot load"):
        make_exporter(
            otlp_config(endpoint="https://127.0.0.1:4318"),
            {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(bad)},
        )


# ---------------------------------------------------------------- retries


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_retries_on_503_then_succeeds(receiver, exporters, protocol):
    rec = receiver(protocol, next_statuses=[503, 503], retry_after_s=0)
    export_ok(exporters(otlp_config(protocol, endpoint=rec.endpoint)), rec, "a")
    assert rec.export_requests == 3
    assert rec.rejected_requests == 2


@pytest.mark.parametrize("status", [429, 502, 504])
def test_http_retryable_statuses_with_backoff(receiver, status):
    rec = receiver("http", next_statuses=[status, status])
    settings = resolve_settings(otlp_config(endpoint=rec.endpoint), {})
    exporter = HTTPExporter(settings, backoff_s=0.01)
    try:
        export_ok(exporter, rec, "a")
    finally:
        exporter.shutdown()
    assert rec.export_requests == 3


@pytest.mark.parametrize(
    ("protocol", "status"),
    # (for gRPC 413 and 429 are RESOURCE_EXHAUSTED: retried only with RetryInfo, tested below)
    [(p, s) for p in PROTOCOLS for s in (400, 401, 403, 413, 500) if (p, s) != ("grpc", 413)],
)
def test_permanent_errors_are_not_retried(receiver, exporters, protocol, status):
    rec = receiver(protocol, status=status, retry_after_s=None)
    exporter = exporters(otlp_config(protocol, endpoint=rec.endpoint))
    assert exporter.export(batch("a")) is False
    assert rec.export_requests == 1


def test_grpc_resource_exhausted_is_retried_only_with_retry_info(receiver):
    rec = receiver("grpc", next_statuses=[429])
    settings = resolve_settings(otlp_config("grpc", endpoint=rec.endpoint), {})
    exporter = GRPCExporter(settings, backoff_s=0.01)
    try:
        assert exporter.export(batch("a")) is False
        assert rec.export_requests == 1
        rec.next_statuses = [429]
        rec.retry_after_s = 0.0
        export_ok(exporter, rec, "a")
        assert rec.export_requests == 3
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_retry_after_is_honoured_and_one_past_the_deadline_ends_the_export(receiver, protocol):
    rec = receiver(protocol, next_statuses=[503], retry_after_s=0.6)
    settings = resolve_settings(
        otlp_config(protocol, endpoint=rec.endpoint, export_timeout_s=3), {}
    )
    cls = GRPCExporter if protocol == "grpc" else HTTPExporter
    exporter = cls(settings, backoff_s=0.01)
    try:
        started = time.monotonic()
        export_ok(exporter, rec, "a")
        assert time.monotonic() - started >= 0.55  # waited for the collector, not 10 ms
        rec.clear()
        rec.next_statuses = [503]
        rec.retry_after_s = 30  # more than the 3 s left: give up now, do not sleep into it
        started = time.monotonic()
        assert exporter.export(batch("b")) is False
        assert time.monotonic() - started < 2.5
        assert rec.export_requests == 1
    finally:
        exporter.shutdown()


def test_http_collector_closing_idle_keepalive_connections_costs_no_batch(receiver, exporters):
    rec = receiver("http")
    exporter = exporters(otlp_config(endpoint=rec.endpoint))
    export_ok(exporter, rec, "a")
    rec.stop()  # closes the kept-alive connection
    rec.start()
    rec.clear()
    export_ok(exporter, rec, "b")
    assert rec.export_requests == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_collector_down_then_back(receiver, exporters, protocol):
    rec = receiver(protocol)
    rec.stop()
    exporter = exporters(otlp_config(protocol, endpoint=rec.endpoint, export_timeout_s=3))
    assert exporter.export(batch("while-down")) is False
    rec.start()
    export_ok(exporter, rec, "after")


# ---------------------------------------------------------------- a dead or black-holed collector


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("collector", ["dead", "black-holed"])
def test_bad_collector_costs_the_queue_nothing(protocol, collector):
    """put() never waits for the exporter: spans beyond the queue are dropped and counted."""
    hole = BlackHole().start() if collector == "black-holed" else None
    endpoint = hole.endpoint if hole else OTLPReceiver(protocol).endpoint  # closed port
    exporter = make_exporter(otlp_config(protocol, endpoint=endpoint, export_timeout_s=30), {})
    queue = SpanQueue(exporter, ENCODER, max_queue_size=100, max_batch=10, schedule_delay_s=0.01)
    span = encoded_span("s")
    slowest = 0.0
    try:
        for _ in range(200):
            started = time.perf_counter()
            queue.put([span] * 5)
            slowest = max(slowest, time.perf_counter() - started)
            time.sleep(0.001)
        assert queue.dropped > 0
        assert queue.exported == 0
    finally:
        started = time.monotonic()
        queue.shutdown(0.2)  # an export stuck on the collector is cut short, not waited for
        shutdown_s = time.monotonic() - started
        if hole is not None:
            hole.stop()
    assert slowest < 0.5  # the export in flight may take 30 s; put() did not wait for it
    assert shutdown_s < 3.0
    deadline = time.monotonic() + 5
    while queue.dropped + queue.failed < 1000 and time.monotonic() < deadline:
        time.sleep(0.01)  # the worker counts the batch it was sending once it is unblocked
    assert queue.dropped + queue.failed == 1000
    assert queue.state() == "failing" or collector == "black-holed"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shutdown_cuts_an_export_stuck_on_a_black_hole_short(protocol):
    with BlackHole() as hole:
        exporter = make_exporter(
            otlp_config(protocol, endpoint=hole.endpoint, export_timeout_s=60), {}
        )
        result: list[bool] = []
        worker = threading.Thread(target=lambda: result.append(exporter.export(batch("a"))))
        worker.start()
        deadline = time.monotonic() + 5
        while hole.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        exporter.shutdown()
        worker.join(10)
        assert not worker.is_alive()
    assert result == [False]
    assert exporter.export(batch("b")) is False  # shut down: no new connection


# ---------------------------------------------------------------- the error log


def test_failure_log_first_then_once_a_minute_then_recovery(caplog):
    now = [1000.0]
    flog = FailureLog("http://collector:4318/v1/traces", clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "gateway.tracing"):
        flog.failure(10, "ConnectionRefusedError")
        for _ in range(100):
            now[0] += 0.5
            flog.failure(10, "ConnectionRefusedError")  # 50 s of failures: silent
        now[0] += 10.5
        flog.failure(7, "timed out")  # 60.5 s after the first line: one summary
        flog.failure(1, "timed out")
        flog.success()
        flog.success()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert messages[0].startswith("span export to http://collector:4318/v1/traces failed: ")
    assert "10 spans dropped" in messages[0]
    assert "still failing: 101 batches (1007 spans) dropped in the last 60 s" in messages[1]
    assert messages[1].endswith("last error: timed out")
    assert "recovered (1 batches, 1 spans dropped since the last report)" in messages[2]
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO"]


def test_a_down_collector_logs_once_not_once_per_batch(exporters, caplog):
    dead = OTLPReceiver("http")  # never started
    exporter = exporters(otlp_config(endpoint=dead.endpoint, export_timeout_s=0.2))
    with caplog.at_level(logging.INFO, "gateway.tracing"):
        for _ in range(20):
            assert exporter.export(batch("a")) is False
    assert len(caplog.records) == 1


# ---------------------------------------------------------------- settings, table


@pytest.mark.parametrize(
    ("cfg", "env", "expected"),
    [
        (otlp_config(), {}, {"endpoint": "http://localhost:4318/v1/traces", "timeout_s": 5.0}),
        (otlp_config("grpc"), {}, {"endpoint": "http://localhost:4317"}),
        (otlp_config(endpoint="http://c:4318"), {}, {"endpoint": "http://c:4318/v1/traces"}),
        (otlp_config(endpoint="http://c:4318/"), {}, {"endpoint": "http://c:4318/v1/traces"}),
        (otlp_config(endpoint="http://c/otlp/traces"), {}, {"endpoint": "http://c/otlp/traces"}),
        (
            otlp_config(),
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:1"},
            {"endpoint": "http://e:1/v1/traces"},
        ),
        (
            otlp_config(),
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:1",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:2/x",
            },
            {"endpoint": "http://t:2/x"},
        ),
        (
            otlp_config("grpc"),
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://g:4317/"},
            {"endpoint": "https://g:4317/"},
        ),
        (otlp_config(), {"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}, {"timeout_s": 2.5}),
        (otlp_config(), {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, {"timeout_s": 5.0}),
        (otlp_config(), {"OTEL_EXPORTER_OTLP_TIMEOUT": "-1"}, {"timeout_s": 5.0}),
        (otlp_config(), {"OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP"}, {"compression": "gzip"}),
        (otlp_config(), {"OTEL_EXPORTER_OTLP_COMPRESSION": "br"}, {"compression": "none"}),
        (
            otlp_config(),
            {
                "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
                "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none",
            },
            {"compression": "none"},
        ),
        (
            otlp_config(),
            {"OTEL_EXPORTER_OTLP_PROTOCOL": " grpc "},
            {"protocol": "grpc", "endpoint": "http://localhost:4317"},
        ),
        (otlp_config(), {"OTEL_EXPORTER_OTLP_INSECURE": "TRUE"}, {"insecure": True}),
        (
            otlp_config(),
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "},
            {"endpoint": "http://localhost:4318/v1/traces"},
        ),
    ],
)
def test_resolve_settings(cfg, env, expected):
    settings = resolve_settings(cfg, env)
    assert {k: getattr(settings, k) for k in expected} == expected


# ---------------------------------------------------------------- grpc is an extra


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "error", **env},
    )


BLOCK_IMPORTS = """
import sys
class Block:
    def __init__(self, *names): self.names = names
    def find_spec(self, name, path=None, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
            raise ImportError(f"blocked for the test: {name}")
        return None
sys.meta_path.insert(0, Block(NAMES))
"""


def test_grpc_missing_is_a_clear_error_naming_the_extra():
    proc = run_python(
        BLOCK_IMPORTS.replace("NAMES", '"grpc"')
        + """
from gateway.config import TracingConfig
from gateway.telemetry.export import ExportConfigError, make_exporter
for cfg, env in [
    (TracingConfig(exporter="otlp", protocol="grpc"), {}),
    (TracingConfig(exporter="otlp"), {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}),
]:
    try:
        make_exporter(cfg, env)
    except ExportConfigError as exc:
        print("error:", exc)
    else:
        print("no error")
"""
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    for line in lines:
        assert line.startswith("error: "), line
        assert "grpcio" in line and "pip install 'llm-gateway[grpc]'" in line


def test_http_export_needs_neither_grpc_nor_an_opentelemetry_exporter_package(receiver):
    rec = receiver("http")
    proc = run_python(
        BLOCK_IMPORTS.replace("NAMES", '"grpc", "opentelemetry.exporter"')
        + """
import sys
from gateway.config import TracingConfig
from gateway.telemetry import otlp
from gateway.telemetry.export import EncodedBatch, make_exporter
exporter = make_exporter(TracingConfig(exporter="otlp", endpoint=sys.argv[0]), {})
encoder = otlp.RequestEncoder({"service.name": "sub"}, "s", "1")
span = otlp.span(trace_id=b"\\x07" * 16, span_id=b"\\x07" * 8, parent_span_id=None,
                 name="from-subprocess", kind=otlp.KIND_SERVER, start_ns=1, end_ns=2,
                 attributes=[])
print(exporter.export(EncodedBatch(encoder.request([span]), 1)))
exporter.shutdown()
""".replace("sys.argv[0]", repr(rec.endpoint))
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
    (span,) = rec.wait_for_spans(1)
    assert span.name == "from-subprocess"


# ---------------------------------------------------------------- the console exporter


def test_console_exporter_prints_one_json_line_per_span():
    import io
    import json

    out = io.StringIO()
    exporter = make_exporter(TracingConfig(exporter="console"))
    assert isinstance(exporter, ConsoleExporter)
    assert ConsoleExporter(out).export(batch("a", "b")) is True
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["name"] for line in lines] == ["a", "b"]


def test_settings_dataclass_defaults_are_the_configs():
    assert OTLPSettings(protocol="grpc", endpoint="x").timeout_s == TracingConfig().export_timeout_s


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300_000, 2**40, -1])
def test_int_attr_is_attrs_wire_format_without_the_memo(value):
    """Token and byte counts are encoded per request, unmemoised, exactly as :func:`otlp.attr`."""
    assert otlp.int_attr("gen_ai.usage.input_tokens", value) == otlp.attr(
        "gen_ai.usage.input_tokens", value
    )
