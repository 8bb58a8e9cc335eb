"""``gateway doctor`` (gateway/client/doctor/, docs/spec.md §17) against real servers on
loopback."""

from __future__ import annotations

import orjson
import pytest

from gateway.client.doctor import (
    DEFAULT_THRESHOLDS,
    StreamShape,
    parse_thresholds,
    server_timing,
    stream_shape,
)
from tests.client.doctor_support import (
    CHAT_MODEL,
    EMBEDDING_MODEL,
    TlsMockServer,
    checks_by_name,
    doctor_json,
    openai_upstream,
    run_cli,
)
from tests.support import Process, config_for, free_port, gateway_cli, openai_client

CHECKS = [
    "dns", "connect", "tls", "ttfb", "http2", "idle", "encoding", "streaming", "proxy", "cache"
]  # fmt: skip
KEYS = {"name", "value", "unit", "threshold", "verdict", "hint", "detail"}


@pytest.fixture(scope="module")
def paced_mock():
    """``gateway mock-upstream --tokens-per-s 50``: one token every 20 ms."""
    port = free_port()
    proc = Process(gateway_cli("mock-upstream", "--port", str(port), "--tokens-per-s", "50"), port)
    yield proc
    proc.stop()


def test_gateway_in_front_of_a_paced_upstream_passes_every_check(gateway, paced_mock):
    gw = gateway(config_for(paced_mock.url + "/v1"))
    out, report = doctor_json(gw.base_url)
    assert out.returncode == 0, out.stdout
    assert report["target"] == gw.base_url
    with openai_client(gw.base_url, "unused") as sdk:
        listed = [m.id for m in sdk.models.list()]
    assert report["model"] == next(m for m in listed if "embed" not in m)  # the first chat model
    assert [c["name"] for c in report["checks"]] == CHECKS
    assert all(set(c) == KEYS for c in report["checks"])
    checks = checks_by_name(report)
    assert checks["tls"]["verdict"] == "skip"  # plain http
    assert checks["idle"]["verdict"] == "skip"  # no --idle-wait
    assert "--idle-wait" in checks["idle"]["hint"]
    for name in CHECKS:
        if name not in ("tls", "idle"):
            assert checks[name]["verdict"] == "ok", checks[name]
    assert checks["http2"]["value"] == "HTTP/1.1, 1 connection for 5 requests"
    assert checks["encoding"]["value"] in ("br", "zstd", "gzip")
    stream = checks["streaming"]
    assert "[DONE]" in stream["detail"] and "no [DONE]" not in stream["detail"]
    assert "gaps p50" in stream["detail"]
    assert isinstance(checks["proxy"]["value"], float)  # read from Server-Timing
    assert "upstream" in checks["proxy"]["detail"]
    assert checks["cache"]["value"] == "HIT"


@pytest.mark.parametrize("through_gateway", [False, True], ids=["direct", "via-gateway"])
def test_a_buffered_stream_fails_streaming(upstream, gateway, through_gateway):
    up = upstream(openai_upstream("buffered", wait_s=0.4))
    base = gateway(config_for(up.url)).base_url if through_gateway else up.url
    out, report = doctor_json(base)
    assert out.returncode == 1
    stream = checks_by_name(report)["streaming"]
    assert stream["verdict"] == "fail"
    assert "bunched" in stream["hint"] and "X-Accel-Buffering: no" in stream["hint"]
    assert stream["value"] >= 300  # the first token waited for the whole stream
    failed = [c["name"] for c in report["checks"] if c["verdict"] == "fail"]
    assert failed == ["streaming"]


def test_a_paced_scripted_stream_is_not_bunched_and_a_cut_one_fails(upstream):
    paced = upstream(openai_upstream("paced", gap_s=0.03))
    out, report = doctor_json(paced.url)
    assert checks_by_name(report)["streaming"]["verdict"] == "ok", out.stdout
    cut = upstream(openai_upstream("no-done", gap_s=0.01))
    out, report = doctor_json(cut.url)
    assert out.returncode == 1
    stream = checks_by_name(report)["streaming"]
    assert stream["verdict"] == "fail"
    assert "[DONE]" in stream["hint"]


def test_a_plain_upstream_skips_proxy_and_cache(mock_upstream):
    out, report = doctor_json(mock_upstream.url + "/v1")
    checks = checks_by_name(report)
    assert checks["proxy"]["verdict"] == "skip"
    assert "Server-Timing" in checks["proxy"]["detail"]
    assert checks["cache"]["verdict"] == "skip"
    assert "x-gateway-cache" in checks["cache"]["detail"]
    # the mock does not compress: a >= 1 KiB embedding went out identity
    assert checks["encoding"]["verdict"] == "warn"
    assert checks["encoding"]["value"] == "identity"
    assert (
        "compression" in checks["encoding"]["hint"] or "br/zstd/gzip" in checks["encoding"]["hint"]
    )
    # warnings and skips are not failures: the exit status follows the fail verdicts alone (the
    # timing rows — ttfb, streaming gaps — may fail on a machine too loaded to keep the pace)
    failed = [c["name"] for c in report["checks"] if c["verdict"] == "fail"]
    assert not set(failed) & {"proxy", "cache", "encoding", "tls", "dns", "connect"}, failed
    assert out.returncode == (1 if failed else 0), failed


def test_the_table_for_people(mock_upstream):
    out = run_cli("doctor", mock_upstream.url + "/v1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"gateway doctor {mock_upstream.url}/v1")
    header = next(line for line in lines if line.startswith("check"))
    assert header.split() == ["check", "value", "threshold", "verdict", "detail"]
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in CHECKS}
    assert list(rows) == CHECKS
    assert " skip " in rows["proxy"] and " skip " in rows["cache"]
    assert any(line.strip().startswith("hint: ") for line in lines)  # the encoding warning
    assert lines[-1] == "0 fail, 1 warn (encoding)"


def test_closed_port_is_one_clear_line():
    port = free_port()
    out = run_cli("doctor", f"http://127.0.0.1:{port}/v1", "--json")
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip() == (
        f"doctor: http://127.0.0.1:{port}/v1: connect to 127.0.0.1:{port} failed: "
        "Connection refused"
    )


def test_thresholds_are_overridable(upstream):
    up = upstream(openai_upstream("buffered", wait_s=0.3))
    # with a wait allowance longer than the buffer's, the same stream is no longer judged bunched
    # (only late: a warning), and ttfb / dns over their (zero) thresholds warn
    out, report = doctor_json(
        up.url, "--threshold", "bunch_wait=5000", "ttft=100", "--threshold", "ttfb=0", "dns=0"
    )
    assert out.returncode == 0, out.stdout
    checks = checks_by_name(report)
    assert checks["streaming"]["verdict"] == "warn"
    assert checks["streaming"]["threshold"] == 100
    assert checks["ttfb"]["verdict"] == "warn" and checks["ttfb"]["threshold"] == 0
    assert checks["dns"]["verdict"] == "warn"
    assert checks["connect"]["threshold"] == DEFAULT_THRESHOLDS["connect"]


@pytest.mark.parametrize("bad", ["nope=1", "ttfb", "ttfb=fast", "dns=-1"])
def test_bad_threshold_is_a_usage_error(bad):
    out = run_cli("doctor", "http://127.0.0.1:1/v1", "--threshold", bad)
    assert out.returncode == 2
    assert out.stderr.startswith("doctor: --threshold")
    assert "Traceback" not in out.stderr


def test_a_new_connection_per_request_fails_http2(upstream):
    up = upstream(openai_upstream(close=True))
    out, report = doctor_json(up.url, "--requests", "3")
    assert out.returncode == 1
    reuse = checks_by_name(report)["http2"]
    assert reuse["verdict"] == "fail"
    assert reuse["value"] == "HTTP/1.1, 3 connections for 3 requests"
    assert "keep-alive" in reuse["hint"]


def test_requests_are_uncacheable_except_the_cache_check_and_the_key_stays_secret(upstream):
    up = upstream(openai_upstream())
    key = "sk-doctor-secret-123"
    out, report = doctor_json(
        up.url, "--api-key-env", "DOCTOR_TEST_KEY", env={"DOCTOR_TEST_KEY": key}
    )
    assert key not in out.stdout + out.stderr
    assert report["model"] == CHAT_MODEL
    assert all(r.header("authorization") == f"Bearer {key}" for r in up.requests)
    posts = [(r, orjson.loads(r.body)) for r in up.requests if r.method == "POST"]
    cacheable = [(r, b) for r, b in posts if b.get("temperature") == 0]
    measured = [(r, b) for r, b in posts if b.get("temperature") != 0]
    # the cache check's deterministic request; not a gateway (no x-gateway-cache): asked once
    assert len(cacheable) == 1
    assert cacheable[0][0].header("cache-control") is None
    assert checks_by_name(report)["cache"]["verdict"] == "skip"
    assert measured, "the ttfb, streaming and encoding requests"
    assert all(r.header("cache-control") == "no-store" for r, _ in measured)
    prompts = [b["messages"][0]["content"] if "messages" in b else b["input"] for _, b in measured]
    assert len(set(prompts)) == len(prompts)  # each one unique
    assert any(b.get("stream") is True for _, b in measured)
    assert any(b.get("model") == EMBEDDING_MODEL for _, b in measured)  # the encoding check


def test_no_model_listing_needs_model(upstream):
    up = upstream(openai_upstream(models_status=404))
    out = run_cli("doctor", up.url)
    assert out.returncode == 2
    assert "pass --model" in out.stderr and "Traceback" not in out.stderr
    out, report = doctor_json(up.url, "--model", "chosen")
    assert report["model"] == "chosen"
    assert checks_by_name(report)["ttfb"]["verdict"] == "ok"


@pytest.mark.parametrize(
    ("mode", "eol"),
    [("paced", b"\r\n"), ("paced", b"\r"), ("buffered", b"\r")],
    ids=["paced-crlf", "paced-cr", "buffered-cr"],
)
def test_cr_and_crlf_streams_are_judged_like_lf_ones(upstream, mode, eol):
    """WHATWG event streams end lines with LF, CRLF or CR; the doctor reads all three alike."""

    def streaming_row(line_end: bytes) -> dict[str, object]:
        up = upstream(openai_upstream(mode, gap_s=0.02, wait_s=0.3, eol=line_end))
        _, report = doctor_json(up.url)
        row = checks_by_name(report)["streaming"]
        return {
            "verdict": row["verdict"],
            "hint": row["hint"],
            "events": row["detail"].split(",")[0],
            "done": "no [DONE]" not in row["detail"],
        }

    lf = streaming_row(b"\n")
    assert lf == {
        "verdict": "ok" if mode == "paced" else "fail",
        "hint": lf["hint"],
        "events": "12 events",  # ten words, the finish chunk, [DONE]
        "done": True,
    }
    assert streaming_row(eol) == lf


def test_a_base_url_without_v1_is_named_instead_of_model(gateway, mock_upstream):
    gw = gateway(config_for(mock_upstream.url + "/v1"))
    out = run_cli("doctor", gw.url)  # http://127.0.0.1:PORT, no /v1: GET /models is a 404
    assert out.returncode == 2
    assert f"did you mean {gw.url}/v1?" in out.stderr, out.stderr
    assert "--model" not in out.stderr
    assert "Traceback" not in out.stderr


def test_without_v1_and_with_model_the_failing_rows_name_v1(upstream):
    up = upstream(openai_upstream())
    root = up.url.removesuffix("/v1")
    out, report = doctor_json(root, "--model", CHAT_MODEL)
    assert out.returncode == 1
    checks = checks_by_name(report)
    for name in ("http2", "ttfb", "streaming"):
        assert checks[name]["verdict"] == "fail", checks[name]
        assert f"did you mean {up.url}?" in checks[name]["hint"], checks[name]


def test_http2_row_is_not_ok_when_the_answers_fail(upstream):
    """One connection for five 404s is no evidence of a healthy connection: not ok."""
    up = upstream(openai_upstream(models_status=404))
    out, report = doctor_json(up.url, "--model", CHAT_MODEL)
    reuse = checks_by_name(report)["http2"]
    assert reuse["value"] == "HTTP/1.1, 1 connection for 5 requests"
    assert reuse["verdict"] == "fail"
    assert "HTTP 404" in reuse["hint"]
    assert checks_by_name(report)["ttfb"]["verdict"] == "ok"  # the chat path itself answers
    assert out.returncode == 1


def test_https_and_http2_rows(tmp_path):
    server = TlsMockServer(tmp_path).start()
    try:
        out, report = doctor_json(server.url, "--cacert", str(server.ca_path))
    finally:
        server.stop()
    checks = checks_by_name(report)
    assert checks["tls"]["verdict"] == "ok"
    assert checks["tls"]["detail"] == "TLSv1.3, ALPN h2"
    assert checks["http2"]["verdict"] == "ok"
    assert checks["http2"]["value"] == "HTTP/2, 1 connection for 5 requests"
    assert checks["streaming"]["verdict"] == "ok", checks["streaming"]
    assert out.returncode == 0, out.stdout


# ---------------------------------------------------------------- the pieces


def test_stream_shape_splits_events_across_reads_and_line_endings():
    reads = [
        (0.010, b': keep-alive\r\n\r\ndata: {"choices": [{"delta": {"role": "assistant"}}]}\r'),
        (0.020, b'\n\r\ndata: {"choices": [{"delta": {"content": "Hi"}}]}\n'),
        (0.030, b"\ndata: [DONE]\n\n"),
    ]
    shape = stream_shape(reads)
    assert shape.arrivals == [0.020, 0.030, 0.030]
    assert shape.ttft == 0.030
    assert shape.done


def test_stream_shape_cr_only_events_keep_the_time_of_their_read():
    reads = [
        (0.010, b'data: {"choices": [{"delta": {"content": "Hi"}}]}\r\r'),
        (0.020, b'data: {"choices": [{"delta": {"content": "!"}}]}\r\r'),
        (0.030, b": keep-alive\r\rdata: [DONE]\r\r"),
    ]
    shape = stream_shape(reads)
    assert shape.arrivals == [0.010, 0.020, 0.030]
    assert shape.ttft == 0.010
    assert shape.done


@pytest.mark.parametrize(
    ("arrivals", "bunched"),
    [
        ([0.5, 0.5, 0.501, 0.501, 0.502], True),  # a long wait, then everything at once
        ([0.002, 0.002, 0.002, 0.003, 0.003], False),  # an instant backend: no wait
        ([0.05, 0.07, 0.09, 0.11, 0.13], False),  # paced
        ([2.0, 2.02, 2.04, 2.06, 2.3], False),  # a slow first token, then a live stream
        ([0.5, 0.5, 0.5], False),  # too few events to tell
    ],
)
def test_bunched_means_a_long_wait_then_everything_at_once(arrivals, bunched):
    shape = StreamShape(arrivals, arrivals[0], True)
    th = DEFAULT_THRESHOLDS
    assert shape.bunched(th["bunch_wait"], th["bunch_ratio"]) is bunched


def test_server_timing_parsing():
    value = 'cdn;dur=2, cache;desc="a, b";dur=0.5, upstream;dur=120.25, gateway;dur=1.5;desc=x'
    assert server_timing(value) == {"cdn": 2.0, "cache": 0.5, "upstream": 120.25, "gateway": 1.5}
    assert server_timing("miss, total;dur=abc") == {}


def test_parse_thresholds_aliases_and_defaults():
    th = parse_thresholds(["ttft=500", "gateway=10", "dns=1.5"])
    assert th["streaming"] == 500 and th["proxy"] == 10 and th["dns"] == 1.5
    assert th["tls"] == DEFAULT_THRESHOLDS["tls"]
    with pytest.raises(ValueError, match="NAME one of"):
        parse_thresholds(["speed=1"])
