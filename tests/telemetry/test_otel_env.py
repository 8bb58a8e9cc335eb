"""A good OpenTelemetry citizen (SPEC §7): OTEL_* variables, url.scheme, auto-instrumentation.

Each variable applies where the config leaves its key at the default; an explicit key wins.
Spans are decoded by a real OTLP receiver.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx2
import pytest

from gateway.config import TracingConfig
from gateway.telemetry.tracing import Tracing, effective_config, resource_attributes
from tests.otlp_receiver import OTLPReceiver
from tests.support import Process, answering, config_for, free_port, wait_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = b'{"id":"c1","object":"chat.completion","model":"m","choices":[]}'


def otlp_config(receiver: OTLPReceiver, extra: str = "") -> str:
    return f"""
[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
schedule_delay_ms = 50
{extra}
"""


def post_chat(base_url: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    with httpx2.Client(timeout=10, trust_env=False) as client:
        return client.post(f"{base_url}/chat/completions", json=CHAT, headers=headers or {})


# ---------------------------------------------------------------- precedence, unit level


@pytest.mark.parametrize(
    ("cfg", "env", "exporter", "ratio", "parent_based"),
    [
        (TracingConfig(exporter="otlp"), {"OTEL_SDK_DISABLED": "true"}, "none", 1.0, True),
        (TracingConfig(exporter="otlp"), {"OTEL_SDK_DISABLED": "TRUE"}, "none", 1.0, True),
        (TracingConfig(exporter="otlp"), {"OTEL_SDK_DISABLED": "false"}, "otlp", 1.0, True),
        (TracingConfig(), {"OTEL_TRACES_EXPORTER": "otlp"}, "otlp", 1.0, True),
        # an explicit config key wins over the variable
        (TracingConfig(exporter="console"), {"OTEL_TRACES_EXPORTER": "otlp"}, "console", 1.0, True),
        (TracingConfig(), {"OTEL_TRACES_SAMPLER": "always_off"}, "none", 0.0, False),
        (TracingConfig(), {"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, "none", 0.0, True),
        (
            TracingConfig(),
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
            "none",
            0.25,
            False,
        ),
        (
            TracingConfig(),
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"},
            "none",
            1.0,
            True,
        ),
        (TracingConfig(sample_ratio=0.5), {"OTEL_TRACES_SAMPLER": "always_off"}, "none", 0.5, True),
        (TracingConfig(), {"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "none", 1.0, True),
    ],
)
def test_otel_variables_apply_where_the_config_keeps_its_default(
    cfg, env, exporter, ratio, parent_based
):
    got, follows_parent = effective_config(cfg, env)
    assert (got.exporter, got.sample_ratio, follows_parent) == (exporter, ratio, parent_based)


def test_service_name_precedence(monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert resource_attributes(TracingConfig())["service.name"] == "llm-gateway"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs,team=llm")
    attrs = resource_attributes(TracingConfig())
    assert attrs["service.name"] == "from-attrs" and attrs["team"] == "llm"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-service-name")
    assert resource_attributes(TracingConfig())["service.name"] == "from-service-name"
    explicit = TracingConfig(service_name="from-config")
    assert resource_attributes(explicit)["service.name"] == "from-config"


def test_always_off_without_parent_based_ignores_a_sampled_parent():
    tracing = Tracing(TracingConfig(), env={"OTEL_TRACES_SAMPLER": "always_off"})
    assert tracing.sample(12345) is False
    assert tracing._parent_based is False


# ---------------------------------------------------------------- through the gateway


def test_sdk_disabled_turns_an_otlp_config_off(gateway, upstream, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    up = upstream(answering(ANSWER))
    gw = gateway(config_for(up.url, extra=otlp_config(receiver)))
    resp = post_chat(gw.base_url)
    assert resp.status_code == 200
    assert "traceresponse" not in resp.headers
    time.sleep(0.4)  # several export intervals
    assert receiver.export_requests == 0 and receiver.spans == []
    assert gw.app.tracing is not None and gw.app.tracing.enabled is False


def test_sampler_always_off_exports_nothing_and_parentbased_follows_the_parent(
    gateway, upstream, receiver, monkeypatch
):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_off")
    up = upstream(answering(ANSWER))
    gw = gateway(config_for(up.url, extra=otlp_config(receiver)))
    assert post_chat(gw.base_url).status_code == 200  # no parent: never sampled
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert post_chat(gw.base_url, {"traceparent": parent}).status_code == 200
    spans = receiver.wait_for(lambda ss: any(s.kind == "SERVER" for s in ss))
    time.sleep(0.3)
    assert {s.trace_id for s in receiver.spans} == {"0af7651916cd43dd8448eb211c80319c"}
    root = next(s for s in spans if s.kind == "SERVER")
    assert root.attributes["url.scheme"] == "http"


def test_resource_attributes_and_url_scheme_on_exported_spans(
    gateway, upstream, receiver, monkeypatch
):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=billing-gateway,env=test")
    up = upstream(answering(ANSWER))
    gw = gateway(config_for(up.url, extra=otlp_config(receiver)))
    assert post_chat(gw.base_url).status_code == 200
    spans = receiver.wait_for(lambda ss: any(s.kind == "SERVER" for s in ss))
    root = next(s for s in spans if s.kind == "SERVER")
    assert root.resource["service.name"] == "billing-gateway"
    assert root.resource["env"] == "test"
    assert root.attributes["url.scheme"] == "http"
    assert root.attributes["http.request.method"] == "POST"
    assert root.attributes["url.path"] == "/v1/chat/completions"


# ---------------------------------------------------------------- opentelemetry-instrument


def test_under_opentelemetry_instrument_the_request_stays_one_trace(upstream, receiver, tmp_path):
    """aiohttp-client auto-instrumentation nests under the gateway's attempt span, and the
    traceparent the upstream receives belongs to the gateway's trace."""
    up = upstream(answering(ANSWER))
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
[[backends]]
name = "up"
url = "{up.url}"
http1_client = "aiohttp"  # the instrumented library (the lean default has no instrumentation)

[[routes]]
models = ["*"]
backends = ["up"]
"""
        + otlp_config(receiver)
    )
    port = free_port()
    instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "llm-gateway",
        "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "redis,asyncio,threading,logging",
    }
    argv = [str(instrument), sys.executable, "-m", "gateway.cli", "serve", "-c", str(config)]
    argv += ["--port", str(port)]
    proc = Process(argv, port, env=env)
    try:
        wait_port(port)
        resp = post_chat(f"http://127.0.0.1:{port}/v1")
        assert resp.status_code == 200, resp.text
        spans = receiver.wait_for(
            lambda ss: (
                any(s.kind == "SERVER" for s in ss) and any("aiohttp" in s.scope_name for s in ss)
            ),
            timeout=15,
        )
    finally:
        out = proc.stop()
    root = next(s for s in spans if s.kind == "SERVER" and s.scope_name == "llm-gateway")
    attempt = next(s for s in spans if s.name == "chat m")
    auto = next(s for s in spans if "aiohttp" in s.scope_name)
    assert auto.trace_id == attempt.trace_id == root.trace_id, out
    assert auto.parent_span_id == attempt.span_id  # nested under the gateway's CLIENT span
    (seen,) = up.requests
    traceparent = seen.header("traceparent")
    assert traceparent is not None and traceparent.split("-")[1] == root.trace_id
    assert traceparent.split("-")[2] in {auto.span_id, attempt.span_id}


# ---------------------------------------------------------------- a key written at its default


@pytest.mark.parametrize(
    ("written", "env", "protocol", "ratio", "exporter"),
    [
        # written in the file with the default's value: still explicit, it wins
        (
            'protocol = "http/protobuf"\nsample_ratio = 1.0\nexporter = "none"',
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_TRACES_SAMPLER": "always_off",
                "OTEL_TRACES_EXPORTER": "otlp",
            },
            "http/protobuf",
            1.0,
            "none",
        ),
        # left out: the variables apply
        (
            'endpoint = "http://127.0.0.1:4318"',
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_TRACES_SAMPLER": "always_off",
                "OTEL_TRACES_EXPORTER": "otlp",
            },
            "grpc",
            0.0,
            "otlp",
        ),
    ],
)
def test_a_key_written_with_its_default_value_wins_over_otel_variables(
    written, env, protocol, ratio, exporter
):
    from gateway.config import load_config
    from gateway.telemetry.export import resolve_settings

    text = (
        '[[backends]]\nname = "b"\nurl = "mock://"\n[[routes]]\nmodels = ["*"]\nbackends = ["b"]\n'
    )
    cfg = load_config(text=text + "[tracing]\n" + written, env={}).tracing
    effective, _ = effective_config(cfg, env)
    assert (effective.exporter, effective.sample_ratio) == (exporter, ratio)
    assert resolve_settings(cfg, env).protocol == protocol


def test_opentelemetry_instrument_without_grpcio_honours_the_configs_http_protocol(
    upstream, receiver, tmp_path
):
    """opentelemetry-distro sets OTEL_EXPORTER_OTLP_PROTOCOL=grpc by default; a config that
    writes protocol = "http/protobuf" (the default value) must still export over HTTP — on a
    plain install, without grpcio, the gateway used to refuse to start.

    grpcio is part of the test extra, so a plain install is made here by hiding it: a
    ``grpc`` package first on PYTHONPATH whose import fails as a missing one does."""
    hide = tmp_path / "no-grpcio" / "grpc"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'grpc\'", name="grpc")\n'
    )
    up = upstream(answering(ANSWER))
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
[[backends]]
name = "up"
url = "{up.url}"

[[routes]]
models = ["*"]
backends = ["up"]
"""
        + otlp_config(receiver, 'protocol = "http/protobuf"')
    )
    port = free_port()
    instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            # the distro's own SDK set-up exports nothing here; it still sets its defaults,
            # OTEL_EXPORTER_OTLP_PROTOCOL=grpc among them
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "redis,asyncio,threading,logging",
            "PYTHONPATH": os.pathsep.join(
                [str(hide.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
    )
    argv = [str(instrument), sys.executable, "-m", "gateway.cli", "serve", "-c", str(config)]
    argv += ["--port", str(port)]
    proc = Process(argv, port, env=env)
    try:
        wait_port(port)
        resp = post_chat(f"http://127.0.0.1:{port}/v1")
        assert resp.status_code == 200, resp.text
        spans = receiver.wait_for(lambda ss: any(s.kind == "SERVER" for s in ss), timeout=15)
    finally:
        out = proc.stop()
    assert any(s.name == "POST /v1/chat/completions" for s in spans), out
