"""Config loading: every key of SPEC §4, every error with its key path, never a crash."""

from __future__ import annotations

import copy
import datetime
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import (
    AuthConfig,
    BackendConfig,
    Config,
    ConfigError,
    MetricsConfig,
    RouteConfig,
    ServerConfig,
    UiConfig,
    build_config,
    load_config,
)

MINIMAL = {
    "backends": [{"name": "a", "url": "http://127.0.0.1:9/v1"}],
    "routes": [{"models": ["*"], "backends": ["a"]}],
}


def errors_of(data: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_config(data, env or {})
    return info.value.errors


def with_(**sections: Any) -> dict[str, Any]:
    return {**MINIMAL, **sections}


def test_spec_defaults_of_the_new_keys():
    cfg = build_config(with_(), {})
    assert cfg.server == ServerConfig()
    s = cfg.server
    assert (s.client_header_timeout_s, s.client_body_timeout_s, s.max_client_connections) == (
        10.0,
        30.0,
        10_000,
    )
    b = cfg.backends[0]
    assert (b.eject_after, b.eject_for_s) == (5, 30.0)
    r = cfg.routes[0]
    assert (r.strategy, r.weights, r.name) == ("ordered", None, "*")
    assert cfg.auth == AuthConfig() and cfg.auth.mode == "off" and cfg.auth.redis_url is None
    assert cfg.metrics == MetricsConfig(enabled=True)
    # the live view is on by default where only this host reaches it (docs/spec.md §18)
    assert cfg.ui == UiConfig(enabled=True, path="/_gateway/", recent=500)
    assert (b.idle_timeout_s, b.max_tokens_field, r.response_affinity_ttl_s) == (30.0, None, 86400)
    assert cfg.logging.format == "json"
    # spend, fleet and realtime keys (docs/spec.md §19-21)
    assert (b.metrics_url, b.metrics_interval_ms, b.max_queue, b.max_kv_cache) == (
        None,
        250.0,
        5,
        0.8,
    )
    assert (r.affinity, r.shed_when_saturated) == ("none", False)
    assert cfg.prices == () and cfg.auth.tenants == ()
    rt = cfg.realtime
    assert (rt.enabled, rt.max_message_bytes, rt.idle_timeout_s, rt.max_session_s) == (
        True,
        16 * 1024 * 1024,
        300.0,
        3600.0,
    )


@pytest.mark.parametrize(
    ("host", "ui", "mode", "enabled"),
    [
        ("127.0.0.1", {}, "off", True),
        ("::1", {}, "off", True),
        ("localhost", {}, "off", True),
        ("0.0.0.0", {}, "off", False),  # beyond loopback with no key: off unless asked for
        ("0.0.0.0", {}, "keys", True),  # behind admin keys
        ("0.0.0.0", {"enabled": True}, "off", True),  # an explicit key wins
        ("127.0.0.1", {"enabled": False}, "off", False),
    ],
)
def test_live_view_default_follows_listen_address_and_auth(host, ui, mode, enabled):
    auth: dict[str, Any] = {"mode": mode}
    if mode == "keys":
        auth["keys"] = [{"tenant": "t", "sha256": "a" * 64}]
    cfg = build_config(with_(server={"host": host}, ui=ui, auth=auth), {})
    assert cfg.ui.enabled is enabled


def test_explicit_keys_are_known_from_file_and_environment():
    data = with_(tracing={"protocol": "http/protobuf"})
    cfg = build_config(data, {"GATEWAY__CACHE__TTL_S": "5"})
    assert cfg.is_set("tracing.protocol") and cfg.is_set("cache.ttl_s")
    assert cfg.is_set("backends[0].url") and cfg.is_set("tracing")
    assert not cfg.is_set("tracing.endpoint") and not cfg.is_set("tracing.exporter")


@pytest.mark.parametrize(
    ("url", "field", "expected"),
    [
        ("https://api.openai.com/v1", None, "max_completion_tokens"),
        ("https://acme.openai.azure.com/openai/v1", None, "max_completion_tokens"),
        ("http://vllm:8000/v1", None, "max_tokens"),
        ("mock://", None, "max_tokens"),
        ("https://api.openai.com/v1", "max_tokens", "max_tokens"),
        ("http://vllm:8000/v1", "max_completion_tokens", "max_completion_tokens"),
    ],
)
def test_max_tokens_field_defaults_by_host(url, field, expected):
    backend: dict[str, Any] = {"name": "b", "url": url}
    if field is not None:
        backend["max_tokens_field"] = field
    cfg = build_config(with_(backends=[backend], routes=[{"models": ["*"], "backends": ["b"]}]), {})
    assert cfg.backends[0].tokens_field == expected


def test_a_config_copied_from_the_spec_sections_is_accepted():
    cfg = build_config(
        with_(
            auth={
                "mode": "keys",
                "redis_url": "redis://127.0.0.1:6379/0",
                "keys": [
                    {
                        "tenant": "team-a",
                        "sha256": "a" * 64,
                        "models": ["*"],
                        "rpm": 600,
                        "tpm": 200000,
                    }
                ],
            },
            logging={"access_log": "sampled", "slow_ms": 500, "sample_ratio": 0.01},
            metrics={"enabled": True},
            ui={"enabled": True, "path": "/_gateway/", "recent": 500},
        ),
        {},
    )
    key = cfg.auth.keys[0]
    assert (key.tenant, key.rpm, key.tpm, key.admin) == ("team-a", 600, 200000, False)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # errors, not crashes: a string where an array belongs, a backend without url
        (
            {"routes": [{"models": "gpt-*", "backends": ["a"]}]},
            "routes[0].models: expected an array, got a string",
        ),
        (
            {"backends": [{"name": "a"}]},
            "backends[0].url: required key is missing",
        ),
        ({"backends": [{"name": "a", "url": "http://[::1"}]}, "backends[0].url: not a valid URL"),
        ({"backends": [{"name": "a", "url": "http://h:99999"}]}, "backends[0].url: not a valid"),
        ({"backends": ["a"]}, "backends[0]: expected a table, got a string"),
        (
            {"routes": [{"models": ["*"], "backends": ["a"], "strategy": "fastest"}]},
            "routes[0].strategy: must be one of",
        ),
        (
            {"routes": [{"models": ["*"], "backends": ["a"], "strategy": "weighted"}]},
            "routes[0].weights: strategy = 'weighted' needs one weight per backend",
        ),
        (
            {"routes": [{"models": ["*"], "backends": ["a"], "weights": [1]}]},
            "routes[0].weights: only used with strategy = 'weighted'",
        ),
        ({"auth": {"mode": "keys"}}, "auth.keys: mode = 'keys' needs at least one"),
        (
            {"auth": {"keys": [{"tenant": "t", "sha256": "xyz"}]}},
            "auth.keys[0].sha256: must be a sha256 hex digest",
        ),
        ({"auth": {"keys": [{"sha256": "a" * 64}]}}, "auth.keys[0].tenant: required key"),
        ({"auth": {"colour": 1}}, "auth.colour: unknown key"),
        (
            {"backends": [{"name": "a", "url": "http://h/v1", "metrics_url": "vllm:8000"}]},
            "backends[0].metrics_url: must be an http(s) URL",
        ),
        (
            {"backends": [{"name": "a", "url": "http://h/v1", "max_kv_cache": 1.5}]},
            "backends[0].max_kv_cache: must be within 0..1",
        ),
        (
            {"routes": [{"models": ["*"], "backends": ["a"], "affinity": "sticky"}]},
            "routes[0].affinity: must be one of",
        ),
        (
            {"prices": [{"models": ["*"], "input": -1, "output": 1}]},
            "prices[0].input: must be >= 0",
        ),
        ({"prices": [{"models": ["*"], "input": 1}]}, "prices[0].output: required key is missing"),
        (
            {"prices": [{"models": ["*"], "input": 1, "output": 1, "batch_discount": 1.5}]},
            "prices[0].batch_discount: must be between 0 and 1",
        ),
        (
            {"auth": {"tenants": [{"name": "t", "budget_usd": 0}]}},
            "auth.tenants[0].budget_usd: must be > 0",
        ),
        (
            {"auth": {"tenants": [{"name": "t"}, {"name": "t"}]}},
            "auth.tenants[1].name: duplicate tenant 't'",
        ),
        (
            {"auth": {"keys": [{"tenant": "t", "sha256": "a" * 64, "budget_period": "year"}]}},
            "auth.keys[0].budget_period: must be one of",
        ),
        ({"realtime": {"max_message_bytes": 0}}, "realtime.max_message_bytes: must be > 0"),
        (
            {
                "backends": [
                    {"name": "a", "url": "https://api.openai.com/v1"},
                    {"name": "b", "url": "http://vllm:8000/v1"},
                ],
                "routes": [{"models": ["*"], "backends": ["a", "b"], "max_tokens_cap": 10}],
            },
            "routes[0].backends: max_tokens_cap sets one field",
        ),
        ({"metrics": {"enabled": "yes"}}, "metrics.enabled: expected true or false"),
        ({"ui": {"path": "gateway"}}, "ui.path: must start and end with '/'"),
        ({"ui": {"path": "/v1/x/"}}, "ui.path: must not shadow"),
        ({"server": {"client_header_timeout_s": 0}}, "server.client_header_timeout_s: must be"),
        ({"server": {"max_client_connections": -1}}, "server.max_client_connections: must be"),
        (
            {"backends": [{"name": "a", "url": "http://h/v1", "eject_for_s": 0}]},
            "backends[0].eject_for_s: must be > 0",
        ),
        ({"tracing": {"sample_ratio": float("nan")}}, "tracing.sample_ratio: expected a number"),
        (
            {"auth": {"keys": [{"tenant": "t", "sha256": "a" * 64, "passthrough": ["v1/audio"]}]}},
            "auth.keys[0].passthrough: each entry is a path glob",
        ),
        (
            {"auth": {"tenants": [{"name": "t", "passthrough": "/v1/*"}]}},
            "auth.tenants[0].passthrough: expected an array",
        ),
    ],
)
def test_each_error_names_its_key_path(data: dict[str, Any], expected: str):
    errors = errors_of({**MINIMAL, **data})
    assert any(e.startswith(expected) for e in errors), errors


def test_a_bad_entry_keeps_the_other_entries_checked_under_their_own_index():
    errors = errors_of(
        {
            "backends": [{"name": "a", "url": "http://h/v1"}, "junk", {"name": "c", "url": "x"}],
            "routes": [{"models": ["*"], "backends": ["a", "nope"]}],
        }
    )
    assert "backends[1]: expected a table, got a string" in errors
    assert any(e.startswith("backends[2].url: scheme must be") for e in errors)
    assert "routes[0].backends[1]: no backend named 'nope'" in errors
    # no follow-on noise for what was already reported
    assert not any(e.startswith("backends[1].") for e in errors)


def test_env_overrides_reach_the_new_sections():
    cfg = build_config(
        with_(),
        {
            "GATEWAY__METRICS__ENABLED": "false",
            "GATEWAY__UI__RECENT": "50",
            "GATEWAY__SERVER__CLIENT_HEADER_TIMEOUT_S": "2.5",
            "GATEWAY__ROUTES__0__STRATEGY": "least_outstanding",
        },
    )
    assert cfg.metrics.enabled is False and cfg.ui.recent == 50
    assert cfg.server.client_header_timeout_s == 2.5
    assert cfg.routes[0].strategy == "least_outstanding"


def test_a_binary_file_is_a_config_error_not_a_crash(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError) as info:
        load_config(bad, env={})
    assert "cannot read" in info.value.errors[0]


# ---------------------------------------------------------------- random shapes

KEYS = [
    "server",
    "backends",
    "routes",
    "cache",
    "tracing",
    "edge",
    "hops",
    "auth",
    "keys",
    "metrics",
    "ui",
    "logging",
    "name",
    "url",
    "models",
    "port",
    "weights",
    "strategy",
    "sha256",
    "tenant",
    "trusted_proxies",
    "header",
    "path",
    "mode",
    "enabled",
    "recent",
    "endpoint",
    "backend",
    "rpm",
]
scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=string.printable, max_size=20),
    st.sampled_from(["http://[::1", "mock://", "redis://x", "*", "weighted", "keys", "a" * 64]),
    st.datetimes(min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2100, 1, 1)),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=25,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)
env_names = st.lists(
    st.tuples(
        st.lists(st.sampled_from([*KEYS, "0", "1", "7", ""]), min_size=1, max_size=4),
        st.text(alphabet=string.printable, max_size=12),
    ),
    max_size=3,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents, env_names)
def test_random_shapes_give_a_config_or_a_config_error_never_a_crash(data, env_parts):
    env = {"GATEWAY__" + "__".join(p.upper() for p in parts): v for parts, v in env_parts}
    try:
        cfg = build_config(data, env)
    except ConfigError as exc:
        assert exc.errors and all(isinstance(e, str) and ": " in e for e in exc.errors)
    else:
        assert isinstance(cfg, Config) and cfg.backends and cfg.routes


@settings(max_examples=60, deadline=None)
@given(documents.map(lambda d: {**copy.deepcopy(MINIMAL), **d}))
def test_random_shapes_on_top_of_a_valid_config(data):
    try:
        cfg = build_config(data, {})
    except ConfigError as exc:
        assert exc.errors
    else:
        assert all(isinstance(b, BackendConfig) for b in cfg.backends)
        assert all(isinstance(r, RouteConfig) for r in cfg.routes)


def test_check_config_exits_2_with_the_paths_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[backends]]\nname = "a"\n\n[[routes]]\nmodels = "gpt-*"\nbackends = ["a"]\n')
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out
    assert "Traceback" not in out.stdout + out.stderr
    assert "backends[0].url: required key is missing" in out.stdout
    assert "routes[0].models: expected an array, got a string" in out.stdout


def _shipped_configs() -> list[Path]:
    root = Path(__file__).resolve().parent.parent
    return sorted([*(root / "config").rglob("*.toml"), *(root / "deploy").rglob("*.toml")])


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: p.name)
def test_no_shipped_config_is_an_open_relay(path: Path):
    """docs/spec.md §3: a config that listens beyond loopback with auth off must not send a
    backend key of the operator's — anyone who reaches the port would spend it."""
    from gateway.config import is_loopback, load_config

    cfg = load_config(path, env={})
    keyed = [b.name for b in cfg.backends if b.api_key_env]
    if not is_loopback(cfg.server.host) and cfg.auth.mode == "off":
        assert not keyed, f"{path.name}: listens on {cfg.server.host} with auth off, sends {keyed}"
