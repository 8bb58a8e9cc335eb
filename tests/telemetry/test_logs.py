"""The JSON access log (SPEC §11): its fields, its sampling, and what it never holds."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from gateway.telemetry.logs import ACCESS_LOGGER
from tests.support import gateway_config, openai_client

PROMPT_MARKER = "prompt-marker-7f3a"
CLIENT_KEY = "sk-client-key-must-not-be-logged"
FIELDS = {
    "trace_id",
    "span_id",
    "request_id",
    "method",
    "path",
    "status",
    "model",
    "route",
    "backend",
    "tenant",
    "cache",
    "request_time_ms",
    "upstream_time_ms",
    "overhead_ms",
    "ttft_ms",
    "tokens",
}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.raw: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.raw.append(record.getMessage())

    @property
    def parsed(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.raw]


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def config(mock_url: str, logging_toml: str):
    return gateway_config(
        f"""
[[backends]]
name = "mock"
url = "{mock_url}/v1"

[[routes]]
name = "gpt"
models = ["*"]
backends = ["mock"]

[tracing]
exporter = "otlp"
endpoint = "http://127.0.0.1:9"

[logging]
{logging_toml}
"""
    )


def calls(base_url: str) -> None:
    client = openai_client(base_url, CLIENT_KEY)
    msg = [{"role": "user", "content": PROMPT_MARKER}]
    client.chat.completions.create(model="mock-gpt-4o", messages=msg)  # fast 200
    list(client.chat.completions.create(model="mock-gpt-4o", messages=msg, stream=True))
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="mock-status-503", messages=msg)
    client.chat.completions.create(  # slow: 300 ms at the upstream
        model="mock-gpt-4o", messages=msg, extra_headers={"x-mock-latency-ms": "300"}
    )


def test_every_line_is_json_with_the_spec_fields_and_no_secret_or_prompt(
    gateway, mock_upstream, lines
):
    gw = gateway(config(mock_upstream.url, 'access_log = "all"'))
    calls(gw.base_url)
    deadline = time.monotonic() + 5
    while len(lines.raw) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(lines.raw) == 4
    for raw, line in zip(lines.raw, lines.parsed, strict=True):
        assert set(line) >= FIELDS, FIELDS - set(line)
        assert PROMPT_MARKER not in raw and CLIENT_KEY not in raw
        assert len(line["trace_id"]) == 32 and len(line["span_id"]) == 16
        assert line["route"] == "gpt" and line["backend"] == "mock"
    by_status = {line["status"]: line for line in lines.parsed}
    assert by_status[503]["error_type"] is not None
    stream = next(line for line in lines.parsed if line["stream"])
    assert stream["ttft_ms"] is not None and stream["ttft_ms"] <= stream["request_time_ms"]
    ok = next(line for line in lines.parsed if line["status"] == 200 and not line["stream"])
    assert ok["tokens"]["input"] > 0 and ok["tokens"]["output"] > 0
    assert ok["request_time_ms"] >= ok["upstream_time_ms"] >= 0
    assert abs(ok["request_time_ms"] - ok["upstream_time_ms"] - ok["overhead_ms"]) < 0.01


def test_sampling_keeps_every_error_and_every_slow_request(gateway, mock_upstream, lines):
    gw = gateway(
        config(mock_upstream.url, 'access_log = "sampled"\nslow_ms = 200\nsample_ratio = 0')
    )
    calls(gw.base_url)
    time.sleep(0.2)
    statuses = sorted(line["status"] for line in lines.parsed)
    assert statuses == [200, 503]  # the slow 200 and the error; the fast ones are sampled out
    slow = next(line for line in lines.parsed if line["status"] == 200)
    assert slow["request_time_ms"] >= 200


def test_access_log_off_writes_nothing(gateway, mock_upstream, lines):
    gw = gateway(config(mock_upstream.url, 'access_log = "off"'))
    calls(gw.base_url)
    time.sleep(0.2)
    assert lines.raw == []


# ---------------------------------------------------------------- every line a JSON object


def _serve_and_collect(tmp_path: Any, fmt: str, host: str = "127.0.0.1") -> list[str]:
    """``gateway serve`` as a process with a backend whose key variable is unset (a warning at
    startup), one request through it, then SIGTERM: every line it wrote."""
    import httpx2

    from tests.support import Process, free_port, gateway_cli

    port = free_port()
    config = tmp_path / f"gateway-{fmt}.toml"
    config.write_text(
        f"""
[server]
host = "{host}"
port = {port}

[logging]
access_log = "all"
level = "info"
format = "{fmt}"

[[backends]]
name = "mock"
url = "mock://"
api_key_env = "GATEWAY_TEST_UNSET_KEY_VARIABLE"

[[routes]]
models = ["*"]
backends = ["mock"]
"""
    )
    proc = Process(
        gateway_cli("serve", "-c", str(config)), port, env={"GATEWAY_TEST_UNSET_KEY_VARIABLE": ""}
    )
    try:
        r = httpx2.post(
            f"{proc.url}/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert r.status_code == 200
    finally:
        out = proc.stop()
    return [line for line in out.splitlines() if line.strip()]


def test_every_line_the_process_writes_is_json_by_default(tmp_path):
    lines = _serve_and_collect(tmp_path, "json")
    parsed = []
    for line in lines:
        try:
            parsed.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}\n" + "\n".join(lines))
    assert all(isinstance(p, dict) for p in parsed)
    # the startup warning, the server's own lines and the access log line are all among them
    warning = [p for p in parsed if p.get("level") == "warning" and p.get("logger") == "gateway"]
    assert any("GATEWAY_TEST_UNSET_KEY_VARIABLE" in p["msg"] for p in warning), parsed
    server = [str(p.get("msg", "")) for p in parsed if p.get("logger") == "gateway"]
    assert any(m.startswith("gateway: application startup complete") for m in server), parsed
    assert any(m.startswith("gateway: application shutdown complete") for m in server), parsed
    assert any(p.get("path") == "/v1/chat/completions" for p in parsed), parsed


def test_text_format_is_for_humans(tmp_path):
    lines = _serve_and_collect(tmp_path, "text")
    warning = [line for line in lines if "GATEWAY_TEST_UNSET_KEY_VARIABLE" in line]
    assert warning and " WARNING gateway: " in warning[0], lines


def test_the_startup_lines_say_where_the_live_view_is_or_how_to_turn_it_on(tmp_path):
    on = [orjson.loads(line).get("msg", "") for line in _serve_and_collect(tmp_path, "json")]
    assert any(m.startswith("gateway: live view on http://127.0.0.1:") for m in on), on
    # a real config listening beyond loopback with auth off: off, and the line says why and how
    off = [
        orjson.loads(line).get("msg", "")
        for line in _serve_and_collect(tmp_path, "json", "0.0.0.0")
    ]
    (line,) = [m for m in off if "live view" in m]
    assert "live view off" in line and "[ui] enabled = true" in line, off
