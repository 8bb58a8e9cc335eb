"""Deploy files are parsed and cross-checked (no Docker engine here)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from gateway.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def test_jaeger_compose_exposes_otlp_and_ui_and_the_gateway_points_at_it():
    compose = yaml.safe_load((ROOT / "deploy/jaeger/docker-compose.yml").read_text())
    jaeger = compose["services"]["jaeger"]
    assert "jaegertracing/jaeger:2." in jaeger["image"]  # Jaeger v2, not the v1 all-in-one
    published = {int(p.split(":")[1]) for p in jaeger["ports"]}
    assert {4317, 4318, 16686} <= published
    gw = compose["services"]["gateway"]
    env = {k: str(v) for k, v in gw["environment"].items()}
    endpoint = urlsplit(env["GATEWAY__TRACING__ENDPOINT"])
    assert endpoint.hostname == "jaeger"
    want = 4318 if env["GATEWAY__TRACING__PROTOCOL"] == "http/protobuf" else 4317
    assert endpoint.port == want
    # the overrides are a valid gateway config on top of the embedded default
    cfg = load_config(env=env)
    assert cfg.tracing.exporter == "otlp" and cfg.server.host == "0.0.0.0"
    assert (ROOT / "deploy/jaeger" / gw["build"]["dockerfile"].split("/")[-1]).exists()
    assert gw["ports"] == [f"{cfg.server.port}:{cfg.server.port}"]


def test_jaeger_readme_names_what_operators_search_for():
    text = (ROOT / "deploy/jaeger/README.md").read_text()
    for needle in (
        "4317",
        "4318",
        "16686",
        "hop.name",
        "gateway.overhead_ms",
        "OTEL_EXPORTER_JAEGER_AGENT_HOST",
        "1.22",
    ):
        assert needle in text, needle
