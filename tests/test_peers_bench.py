"""loadtests/peers, offline: its arguments, its table, and its proxy checks against a real socket.

Nothing here installs or starts a peer, nor runs wrk or nginx: that is the benchmark itself
(loadtests/README.md), run by hand on a quiet machine.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# appended, not first: the scripts there must never shadow an installed module for later tests
sys.path.append(str(ROOT / "loadtests"))

import overhead  # noqa: E402
from peers import bench, check, install, report  # noqa: E402


def test_arguments_default_to_every_target_and_reject_bad_ones(capsys):
    args = bench.parse_args([])
    assert args.only is None and args.duration == 10.0 and args.connections == 32
    assert args.cache_dir == (ROOT / "loadtests" / ".peers").resolve()
    args = bench.parse_args(["--only", "litellm", "--only", "core", "--cores", "0,1"])
    assert args.only == ["litellm", "core"] and args.cores == "0,1"
    for bad in (["--only", "nginx"], ["--duration", "0.5"], ["--warmup", "0"], ["--repeat", "0"]):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(bad)
        assert exc.value.code == 2
    assert "invalid choice: 'nginx'" in capsys.readouterr().err


def test_list_runs_as_a_directory_and_names_every_target():
    res = subprocess.run(
        [sys.executable, str(ROOT / "loadtests" / "peers"), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    names = [line.split()[0] for line in res.stdout.splitlines()]
    assert names == ["core", "everything", "vllm-router", "portkey", "litellm"]


def _measured(rps: float, p50_ms: float, cpu_us: float | None, non_2xx: int = 0):
    m = overhead.Measurement()
    m.thr = overhead.WrkResult(rps=rps, requests=int(rps * 10), non_2xx=non_2xx)
    m.lat = overhead.WrkResult(rps=1000 / p50_ms, p50_ms=p50_ms)
    m.all_thr, m.all_lat = [m.thr], [m.lat]
    m.gw_cpu_us = cpu_us
    m.gw_cpu_pct = None if cpu_us is None else 99.0
    return m


def test_table_compares_each_proxy_with_direct_and_with_gateway_core():
    results = [
        bench.Result("direct", "direct (nginx, no proxy)", m=_measured(50_000, 0.020, None)),
        bench.Result("core", "gateway core", "abc1234", m=_measured(7_000, 0.200, 140.0)),
        bench.Result("vllm-router", "vllm-router", "0.1.17", m=_measured(12_000, 0.150, 70.0)),
        bench.Result("litellm", "litellm", "1.0", reason="it exited with status 3 | x\nlog"),
    ]
    lines = report.render(results, 32).splitlines()
    assert lines[0].startswith("| proxy | version | req/s @c32 |")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert cells[0][:5] == ["direct (nginx, no proxy)", "—", "50,000", "0.020", "—"]
    assert cells[1][2:7] == ["7,000", "0.200", "0.180", "140", "1.00x"]
    assert cells[2][2:7] == ["12,000", "0.150", "0.130", "70", "0.50x"]
    # a peer without figures: dashes, and the first line of its reason (a "|" escaped)
    assert lines[5].endswith("| it exited with status 3 \\| x |")
    assert cells[3][2:8] == ["—"] * 6


def test_report_fails_on_a_target_without_figures_or_with_errors():
    args = bench.parse_args(["--duration", "1"])
    pin = overhead.Pinning(None, None)
    ok = [
        bench.Result("direct", "direct", m=_measured(50_000, 0.02, None)),
        bench.Result("core", "gateway core", m=_measured(7_000, 0.2, 140.0)),
    ]
    text, failed = report.report(ok, pin, args)
    assert not failed and "not measured" not in text
    missing = [*ok, bench.Result("portkey", "portkey", reason="install failed: npm not found")]
    text, failed = report.report(missing, pin, args)
    assert failed and "not measured: portkey: install failed: npm not found" in text
    erred = [ok[0], bench.Result("core", "gateway core", m=_measured(7_000, 0.2, 140.0, 5))]
    text, failed = report.report(erred, pin, args)
    assert failed and "gateway core: errors during the run" in text
    text, _ = report.report(ok[:1], pin, args)
    assert "gateway core was not measured: no CPU ratio to it" in text


def test_the_stream_check_reads_the_stream_nginx_is_given():
    """The stream nginx answers long bodies with carries the text the JSON answer carries, and
    only the stream request is long enough to get it."""
    assert check.stream_text(overhead.UPSTREAM_SSE.encode()) == (check.EXPECTED, True)
    message = json.loads(overhead.UPSTREAM_BODY)["choices"][0]["message"]["content"]
    assert message == check.EXPECTED
    assert len(check.request_body("m", stream=True)) >= overhead.STREAM_BODY_BYTES
    assert len(check.request_body("m", stream=False)) < overhead.STREAM_BODY_BYTES


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Answers as overhead.py's nginx does (by body length), or as told by ``mode``."""

    protocol_version = "HTTP/1.1"
    mode = "right"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        stream = len(body) >= overhead.STREAM_BODY_BYTES
        ctype, out = "application/json", overhead.UPSTREAM_BODY
        if stream and self.mode != "json-for-stream":
            ctype, out = "text/event-stream", overhead.UPSTREAM_SSE
            if self.mode == "no-done":
                out = out.replace("data: [DONE]\n\n", "")
        if self.mode == "refuse":
            ctype, out = "application/json", '{"error":{"message":"no"}}'
        data = out.encode()
        self.send_response(401 if self.mode == "refuse" else 200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[tuple[int, type[_Upstream]]]:
    handler = type("Handler", (_Upstream,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


def test_checks_pass_a_proxy_that_passes_both_answers(upstream):
    port, _ = upstream
    check.check_json(port, {}, "gpt-4o-mini")
    check.check_stream(port, {}, "gpt-4o-mini")


@pytest.mark.parametrize(
    ("mode", "which", "says"),
    [
        ("refuse", "json", "a JSON chat completion was answered 401"),
        ("refuse", "stream", "a streamed chat completion was answered 401"),
        ("json-for-stream", "stream", "was answered as 'application/json'"),
        ("no-done", "stream", "(without data: [DONE])"),
    ],
)
def test_checks_say_what_a_proxy_did_wrong(upstream, mode, which, says):
    port, handler = upstream
    handler.mode = mode
    fn = check.check_json if which == "json" else check.check_stream
    with pytest.raises(check.CheckFailed) as exc:
        fn(port, {}, "gpt-4o-mini")
    assert says in str(exc.value)


def test_a_closed_port_is_a_check_failure_not_a_crash():
    port = overhead.free_port()
    with pytest.raises(check.CheckFailed) as exc:
        check.check_json(port, {}, "gpt-4o-mini")
    assert isinstance(exc.value.__cause__, ConnectionRefusedError)


def test_package_names_and_wrk_headers(tmp_path):
    assert install.package_name("pip", "litellm[proxy]==1.108.7") == "litellm"
    assert install.package_name("pip", "vllm-router==0.1.17") == "vllm-router"
    assert install.package_name("npm", "@portkey-ai/gateway@1.15.2") == "@portkey-ai/gateway"
    assert bench.peer_script(tmp_path, "x", {}) == "chat.lua"
    script = Path(bench.peer_script(tmp_path, "portkey", {"x-portkey-provider": "openai"}))
    text = script.read_text()
    assert text.startswith((overhead.WRK_DIR / "chat.lua").read_text())
    assert text.rstrip().endswith('wrk.headers["x-portkey-provider"] = "openai"')
