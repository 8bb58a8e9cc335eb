"""The built-in live view (SPEC §18) over real sockets: the page in headless Chromium, the JSON
API against the spans a real OTLP receiver decoded, the SSE feed, and admin-key protection."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from playwright.sync_api import Page, Route, sync_playwright

from gateway.config import load_config
from gateway.live import view as live
from gateway.telemetry.logs import ACCESS_LOGGER
from tests.faults import FaultyUpstream
from tests.live.test_realtime import turn
from tests.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.support import (
    GatewayServer,
    SeenRequest,
    free_port,
    gateway_config,
    http_response,
    openai_client,
)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"  # Debian's package (.ci/run installs it); never a download
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
MSG = [{"role": "user", "content": "show me the hops"}]
SLOW_MS = 60


def view_config(upstream: str, receiver: OTLPReceiver, extra: str = "") -> str:
    return f"""
[[backends]]
name = "up"
url = "{upstream}/v1"

[[routes]]
name = "chat"
models = ["*"]
backends = ["up"]

[cache]
backend = "memory"

[tracing]
exporter = "otlp"
endpoint = "{receiver.endpoint}"
protocol = "http/protobuf"
sample_ratio = 1.0
schedule_delay_ms = 50

[edge]
trusted_proxies = ["127.0.0.1/32"]
[[edge.hops]]
name = "cdn"
header = "x-cdn-start"
[[edge.hops]]
name = "lb"
header = "x-request-start"

[logging]
access_log = "off"
slow_ms = {SLOW_MS}

[ui]
enabled = true
{extra}
"""


def rid(label: str) -> str:
    return f"lv-{label}-{uuid.uuid4().hex[:8]}"


@dataclass
class Live:
    gw: GatewayServer
    receiver: OTLPReceiver
    client: openai.OpenAI
    #: label -> the x-request-id it was sent with
    ids: dict[str, str] = field(default_factory=dict)

    @property
    def view(self) -> str:
        return self.gw.url + "/_gateway/"

    def api(self, path: str = "api/requests", **params: Any) -> Any:
        r = httpx2.get(self.view + path, params=params, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def chat(self, label: str, headers: dict[str, str] | None = None, **kw: Any) -> Any:
        self.ids[label] = rid(label)
        h = {"x-request-id": self.ids[label], **(headers or {})}
        kw.setdefault("model", "mock-gpt-4o")
        kw.setdefault("temperature", 0.7)
        raw = self.client.chat.completions.with_raw_response.create(
            messages=MSG, extra_headers=h, **kw
        )
        assert raw.headers["x-request-id"] == self.ids[label]
        return raw

    def stream(self, label: str) -> None:
        self.ids[label] = rid(label)
        with self.client.chat.completions.with_streaming_response.create(
            model="mock-gpt-4o",
            messages=MSG,
            stream=True,
            extra_headers={
                "x-request-id": self.ids[label],
                "x-mock-ttft-ms": "15",
                "x-mock-tokens-per-s": "400",
            },
        ) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert any(line == "data: [DONE]" for line in resp.iter_lines())


def send_traffic(lv: Live) -> None:
    """JSON, a stream, a cache miss then hit, retried 503s, a 400, edge timing headers."""
    lv.chat("json", headers={"x-mock-ttft-ms": "5"})
    lv.stream("stream")
    assert lv.chat("miss", temperature=0).headers["x-gateway-cache"] == "MISS"
    assert lv.chat("hit", temperature=0).headers["x-gateway-cache"] == "HIT"
    with pytest.raises(openai.APIStatusError) as err:  # retried twice (with backoff), then 503
        lv.chat("error", model="mock-status-503")
    assert err.value.status_code == 503
    lv.ids["invalid"] = rid("invalid")
    r = httpx2.post(
        lv.gw.base_url + "/chat/completions",
        content=b"{not json",
        headers={"x-request-id": lv.ids["invalid"], "content-type": "application/json"},
    )
    assert r.status_code == 400
    now = time.time()
    lv.chat(
        "edge",
        headers={
            "x-cdn-start": f"t={now - 0.050:.6f}",  # seconds
            "x-request-start": f"t={int((now - 0.020) * 1000)}",  # milliseconds
        },
    )
    lv.chat("slow", headers={"x-mock-latency-ms": str(SLOW_MS + 20)})
    # none of these is recorded in the buffer
    for path in ("/healthz", "/readyz", "/metrics", "/_gateway/", "/_gateway/api/backends"):
        assert httpx2.get(lv.gw.url + path).status_code == 200, path


@pytest.fixture(scope="module")
def lv(mock_upstream) -> Iterator[Live]:
    with OTLPReceiver("http") as receiver:
        gw = GatewayServer(gateway_config(view_config(mock_upstream.url, receiver))).start()
        try:
            client = openai_client(gw.base_url, "sk-x")
            lv = Live(gw, receiver, client)
            send_traffic(lv)
            yield lv
        finally:
            gw.stop()


@contextlib.contextmanager
def chromium() -> Iterator[tuple[Page, list[str]]]:
    """Headless Debian chromium driven by Playwright; JS errors collected."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            yield page, errors
        finally:
            browser.close()


_ROWS_JS = """
() => [...document.querySelectorAll('#requests tbody tr.req')].map(tr => ({
  id: tr.dataset.id,
  idText: tr.querySelector('td.id').textContent,
  seq: Number(tr.dataset.seq),
  status: Number(tr.dataset.status),
  statusText: tr.querySelector('td.status').textContent,
  cache: tr.dataset.cache,
  cells: [...tr.children].map(td => td.textContent),
  requestMs: Number(tr.dataset.requestMs),
  totalMs: Number(tr.dataset.totalMs),
  error: tr.classList.contains('err'),
  mark: tr.querySelector('.wf .mark') !== null,
  bars: [...tr.querySelectorAll('.wf .bar')].map(b => {
    const box = b.getBoundingClientRect();
    return {name: b.dataset.name, kind: b.dataset.kind, dur: Number(b.dataset.durMs),
            left: box.left, width: box.width};
  }),
  subs: [...tr.querySelectorAll('.wf .sub')].map(s => s.dataset.name),
}))
"""


def rendered(page: Page) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in page.evaluate(_ROWS_JS)}


def named(bars: list[dict[str, Any]]) -> list[str]:
    """The bar names without the short gateway gaps between hops."""
    return [b["name"] for b in bars if b["kind"] != "gap"]


def wait_rows(page: Page, count: int) -> None:
    page.wait_for_function(
        "n => document.querySelectorAll('#requests tbody tr.req').length >= n", arg=count
    )


def test_the_page_draws_each_request_as_a_waterfall_and_updates_live(lv):
    api = lv.api()
    records = {r["id"]: r for r in api["requests"]}
    assert set(records) == set(lv.ids.values())  # only model calls: the view's own are not
    with chromium() as (page, errors):
        page.goto(lv.view)
        wait_rows(page, len(records))
        page.evaluate("window.__notReloaded = true")
        rows = rendered(page)
        assert set(rows) == set(records)
        seqs = [r["seq"] for r in page.evaluate(_ROWS_JS)]
        assert seqs == sorted(seqs, reverse=True)  # newest first
        for request_id, row in rows.items():
            rec = records[request_id]
            assert row["idText"] == request_id
            assert [b["name"] for b in row["bars"]] == [h["name"] for h in rec["hops"]]
            # the bars tile the request: they add up to it, and each starts where the last ended
            durations = [b["dur"] for b in row["bars"]]
            assert sum(durations) == pytest.approx(row["totalMs"], abs=1.0)
            gateway_ms = sum(b["dur"] for b in row["bars"] if b["kind"] != "edge")
            assert gateway_ms == pytest.approx(row["requestMs"], abs=1.0)
            assert row["requestMs"] == rec["request_ms"]
            for a, b in itertools.pairwise(row["bars"]):
                assert b["left"] == pytest.approx(a["left"] + a["width"], abs=1.5), request_id
        ids = lv.ids
        assert named(rows[ids["json"]]["bars"]) == ["intake", "auth", "router", "upstream", "relay"]
        assert named(rows[ids["edge"]]["bars"]) == [
            "cdn",
            "lb",
            "intake",
            "auth",
            "router",
            "upstream",
            "relay",
        ]
        cdn, lb = rows[ids["edge"]]["bars"][:2]
        assert cdn["dur"] == pytest.approx(30.0, abs=2.0)
        assert 19.0 <= lb["dur"] < 20.0 + 500  # to `received`: + the client's own time
        # the cache hit: replayed, no upstream; its lookup drawn inside the router
        hit = rows[ids["hit"]]
        assert hit["cache"] == "hit" and "hit" in hit["cells"]
        assert named(hit["bars"]) == ["intake", "auth", "router", "replay"]
        assert "cache lookup" in hit["subs"]
        assert "cache store" in rows[ids["miss"]]["subs"]
        # the error rows: three attempts with the backoff between them; a refused body
        error = rows[ids["error"]]
        assert error["error"] and error["status"] == 503 and error["statusText"] == "503"
        assert [b["name"] for b in error["bars"] if b["name"] in ("upstream", "backoff")] == [
            "upstream",
            "backoff",
            "upstream",
            "backoff",
            "upstream",
        ]
        invalid = rows[ids["invalid"]]
        assert invalid["error"] and invalid["status"] == 400
        assert named(invalid["bars"]) == ["intake", "auth", "router"]
        assert rows[ids["stream"]]["mark"]  # the first token, marked on its waterfall
        assert not rows[ids["json"]]["error"]
        check_stats_filters_and_backends(page, api, lv)
        # a request made while the page is open appears without a reload, on top
        lv.chat("live")
        page.wait_for_selector(f'tr[data-id="{lv.ids["live"]}"]', timeout=10_000)
        assert page.evaluate("window.__notReloaded") is True
        assert page.evaluate(_ROWS_JS)[0]["id"] == lv.ids["live"]
        check_realtime_sessions(page, lv)
        assert page.evaluate("window.__notReloaded") is True
        assert errors == []


def check_stats_filters_and_backends(page: Page, api: dict[str, Any], lv: Live) -> None:
    for metric in ("request_ms", "overhead_ms", "ttft_ms"):
        for p in ("p50", "p90", "p99"):
            value = page.get_attribute(
                f'#stats .card[data-metric="{metric}"] dd[data-p="{p}"]', "data-value"
            )
            assert float(value) == api["stats"][metric][p], (metric, p)
    page.select_option("#f-status", "5xx")
    shown = rendered(page)
    assert set(shown) == {lv.ids["error"]}
    page.select_option("#f-status", "error")
    assert set(rendered(page)) == {lv.ids["error"], lv.ids["invalid"]}
    page.select_option("#f-status", "")
    page.check("#f-slow")
    slow = rendered(page)
    assert lv.ids["slow"] in slow
    assert all(r["requestMs"] >= SLOW_MS for r in slow.values())
    page.uncheck("#f-slow")
    page.select_option("#f-model", "mock-status-503")
    assert set(rendered(page)) == {lv.ids["error"]}
    page.select_option("#f-model", "")
    assert len(rendered(page)) == len(api["requests"])
    backend = page.locator('#backends tr[data-backend="up"]')
    backend.wait_for()
    assert "in rotation" in backend.inner_text()


_OPEN_JS = """
id => {
  const tr = document.querySelector(`#sessions tr[data-id="${id}"]`);
  return {cells: [...tr.children].map(td => td.textContent), in: Number(tr.dataset.messagesIn),
          out: Number(tr.dataset.messagesOut), responses: Number(tr.dataset.responses),
          hidden: document.getElementById('sessions-section').hidden};
}
"""
_RESPONSES_JS = """
() => [...document.querySelectorAll('#d-responses tbody tr.response')].map(tr => ({
  id: tr.dataset.id, ttft: tr.querySelector('td.ttft').textContent,
  tokensOut: tr.querySelector('td.tokens-out').textContent,
}))
"""


def check_realtime_sessions(page: Page, lv: Live) -> None:
    """A realtime session on the open page: listed under "Open sessions" (the page polls it)
    with its messages and response, then, once closed, a WS row with its close code whose
    detail lists the responses with TTFT."""
    assert page.is_hidden("#sessions-section")  # hidden when none is open
    session = lv.ids["ws"] = rid("ws")
    with lv.client.realtime.connect(
        model="mock-gpt-4o", extra_headers={"x-request-id": session}, max_retries=0
    ) as conn:
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        types, done = turn(conn, "show me the session")
        page.wait_for_selector(f'#sessions tr[data-id="{session}"]', timeout=10_000)
        # a poll may have landed mid-turn: wait for one that saw the whole turn (every 5 s)
        page.wait_for_function(
            """([id, out]) => {
              const tr = document.querySelector(`#sessions tr[data-id="${id}"]`);
              return tr && tr.dataset.messagesIn === "3" && tr.dataset.responses === "1"
                && Number(tr.dataset.messagesOut) === out;
            }""",
            arg=[session, len(types)],
            timeout=15_000,
        )
        row = page.evaluate(_OPEN_JS, session)
        assert not row["hidden"] and row["in"] == 3 and row["out"] == len(types)
        assert row["responses"] == 1 and session in row["cells"][1]
        assert row["cells"][3:5] == ["chat", "up"]
        page.click(f'#sessions tr[data-id="{session}"]')
        assert page.text_content("#d-kind") == "Open session"
        (shown,) = page.evaluate(_RESPONSES_JS)
        assert shown["id"] == done.response.id and float(shown["ttft"]) > 0
        assert shown["tokensOut"] == str(done.response.usage.output_tokens)
    # closed: its record comes by the live feed; the open list is empty again
    tr = f'#requests tr.ws[data-id="{session}"]'
    page.wait_for_selector(tr, timeout=10_000)
    page.wait_for_function("() => document.getElementById('sessions-section').hidden")
    rec = next(r for r in lv.api()["requests"] if r["id"] == session)
    rt = rec["realtime"]
    assert page.get_attribute(tr, "data-close-code") == "1000" == str(rt["close_code"])
    assert page.get_attribute(tr, "data-messages-out") == str(rt["messages_out"])
    assert page.text_content(f"{tr} td.method .badge") == "WS"
    summary = page.text_content(f"{tr} .session-sum")
    assert "messages in 3 / out " + str(rt["messages_out"]) in summary
    assert "1 response" in summary and "close 1000 by client" in summary
    # the detail that showed the open session now shows the finished one
    page.wait_for_function("() => document.getElementById('d-kind').textContent === 'Session'")
    page.click("#d-close")
    page.click(tr)
    assert page.text_content("#d-kind") == "Session" and page.is_visible("#d-responses")
    (shown,) = page.evaluate(_RESPONSES_JS)
    ttft = rt["responses"][0]["ttft_ms"]
    assert shown["id"] == done.response.id and float(shown["ttft"]) == pytest.approx(ttft, abs=0.1)
    # a request shows no responses table
    page.click(f'#requests tr[data-id="{lv.ids["json"]}"]')
    assert page.text_content("#d-kind") == "Request" and page.is_hidden("#d-responses")


# ---------------------------------------------------------------- the API and the spans

ROOT_SPAN = "POST /v1/chat/completions"


def traces(lv: Live, records: list[dict[str, Any]]) -> dict[str, list[ReceivedSpan]]:
    wanted = {r["trace_id"] for r in records}

    def complete(spans: list[ReceivedSpan]) -> bool:
        roots = {s.trace_id for s in spans if s.kind == "SERVER"}
        return wanted <= roots

    lv.receiver.wait_for(complete)
    return {t: lv.receiver.trace(t) for t in wanted}


def offset_ms(span: ReceivedSpan, root: ReceivedSpan) -> float:
    return (span.start_ns - root.start_ns) / 1e6


def assert_same_interval(seg: dict[str, Any], span: ReceivedSpan, root: ReceivedSpan) -> None:
    assert seg["dur_ms"] == pytest.approx(span.duration_ms, abs=0.0025), span.name
    assert seg["start_ms"] == pytest.approx(offset_ms(span, root), abs=0.0025), span.name


def test_the_json_records_match_the_exported_spans(lv):
    records = [r for r in lv.api()["requests"] if r["path"] == "/v1/chat/completions"]
    assert all(r["sampled"] for r in records)
    by_trace = traces(lv, records)
    for rec in records:
        spans = by_trace[rec["trace_id"]]
        root = next(s for s in spans if s.kind == "SERVER")
        attrs = root.attributes
        assert attrs["gateway.request_id"] == rec["id"]
        assert attrs["http.response.status_code"] == rec["status"]
        assert attrs["gateway.cache"] == rec["cache"]
        assert attrs.get("gateway.route") == rec["route"]
        assert attrs.get("gen_ai.request.model") == rec["model"]
        for key in ("request_time_ms", "upstream_time_ms", "overhead_ms", "ttft_ms"):
            ours = rec[key.replace("_time", "")]
            assert attrs.get(f"gateway.{key}") == (
                pytest.approx(ours, abs=0.0015) if ours else ours
            )
        # the waits between attempts: on the root span only when there were any
        assert attrs.get("gateway.backoff_ms", 0.0) == pytest.approx(rec["backoff_ms"], abs=0.0015)
        # the waterfall spans the root: edge hops first, done last
        assert rec["total_ms"] == pytest.approx(root.duration_ms, abs=0.0025)
        hops = {h["name"]: h for h in rec["hops"] if h["kind"] in ("edge", "gateway")}
        for span in spans:
            if span.name.startswith("hop "):
                assert_same_interval(hops[span.name[4:]], span, root)
        attempts = [h for h in rec["hops"] if h["kind"] == "upstream"]
        clients = sorted(
            (s for s in spans if s.kind == "CLIENT"), key=lambda s: s.attributes["gateway.attempt"]
        )
        assert [a["attempt"] for a in attempts] == [
            c.attributes["gateway.attempt"] for c in clients
        ]
        for seg, span in zip(attempts, clients, strict=True):
            assert_same_interval(seg, span, root)
            assert seg["backend"] == span.attributes["gateway.backend"]
            assert seg["status"] == span.attributes.get("http.response.status_code")
        details = {d["name"]: d for d in rec["details"]}
        cache_spans = {s.name: s for s in spans if s.name.startswith("cache ")}
        assert set(details) == set(cache_spans)
        for name, span in cache_spans.items():
            assert_same_interval(details[name], span, root)


def test_filters_in_the_api(lv):
    errors = lv.api(status="5xx")["requests"]
    assert [r["id"] for r in errors] == [lv.ids["error"]]
    assert len(errors[0]["attempts"]) == 3
    slow = lv.api(slow="1")
    assert lv.ids["slow"] in {r["id"] for r in slow["requests"]}
    requests = [r for r in slow["requests"] if "realtime" not in r]  # sessions are left out
    assert slow["stats"]["request_ms"]["count"] == len(requests)
    assert lv.api(limit="1")["requests"][0]["seq"] == lv.api()["buffer"]["last"]
    for params, code in (({"status": "6zz"}, "invalid_status"), ({"key": "x"}, None)):
        r = httpx2.get(lv.view + "api/requests", params=params)
        assert r.status_code == 400
        assert r.json()["error"]["type"] == "invalid_request_error"
        if code:
            assert r.json()["error"]["code"] == code


def test_the_live_feed_resumes_after_each_reconnect(lv, monkeypatch):
    monkeypatch.setattr(live, "STREAM_MAX_S", 1.0)
    last = lv.api()["buffer"]["last"]
    with httpx2.stream("GET", lv.view + f"api/stream?after={last}", timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        started = time.monotonic()
        lv.chat("feed-1")
        events = sse_events(resp.iter_lines())  # ends by itself after STREAM_MAX_S
    assert time.monotonic() - started < 5
    assert [e["id"] for e in events] == [lv.ids["feed-1"]]
    lv.chat("feed-2")  # made while nobody listened
    with httpx2.stream(
        "GET",
        lv.view + "api/stream",
        headers={"last-event-id": str(events[-1]["seq"])},
        timeout=10,
    ) as resp:
        again = sse_events(resp.iter_lines())
    assert [e["id"] for e in again] == [lv.ids["feed-2"]]
    r = httpx2.get(lv.view + "api/stream", headers={"last-event-id": "x"})
    assert r.status_code == 400


def sse_events(lines: Iterator[str]) -> list[dict[str, Any]]:
    import orjson

    events, current = [], {}
    for line in lines:
        if not line:
            if current.get("event") == "request":
                record = orjson.loads(current["data"])
                assert int(current["id"]) == record["seq"]
                events.append(record)
            current = {}
        elif ":" in line:
            key, _, value = line.partition(":")
            current[key] = value.lstrip(" ")
    return events


# ---------------------------------------------------------------- backends and retries


def health_config(mock_url: str, dead_url: str) -> str:
    """Two backends on one route: ``dead`` (nothing listens there) first, then the mock."""
    return f"""
[[backends]]
name = "dead"
url = "{dead_url}/v1"
eject_after = 1
eject_for_s = 600
[[backends]]
name = "up"
url = "{mock_url}/v1"
eject_after = 1
eject_for_s = 600
[[routes]]
models = ["*"]
backends = ["dead", "up"]
retries = 0
[cache]
backend = "off"
[ui]
enabled = true
"""


def test_backends_show_the_passive_health_readyz_reports(gateway, mock_upstream):
    gw = gateway(
        gateway_config(health_config(mock_upstream.url, f"http://127.0.0.1:{free_port()}"))
    )
    client = openai_client(gw.base_url, "sk-x")
    # refused by `dead` (ejected at once), answered by `up`
    client.chat.completions.create(model="mock-gpt-4o", messages=MSG)
    # a 5xx answer for one model: counts against that (backend, model) pair
    with pytest.raises(openai.APIStatusError):
        client.chat.completions.create(model="mock-status-503", messages=MSG)
    ready = httpx2.get(gw.url + "/readyz").json()["backends"]
    view = {
        b["name"]: b["health"]
        for b in httpx2.get(gw.url + "/_gateway/api/backends").json()["backends"]
    }
    assert view["dead"]["state"] == ready["dead"]["state"] == "ejected"
    assert view["dead"]["label"] == "ejected" and view["dead"]["up"] is False
    assert view["up"]["state"] == ready["up"]["state"] == "up"
    assert view["up"]["label"] == "in rotation"
    assert view["up"]["models"] == ready["up"]["models"] == {"mock-status-503": "ejected"}
    with chromium() as (page, errors):
        page.goto(gw.url + "/_gateway/")
        dead = page.locator('#backends tr[data-backend="dead"] td.health')
        dead.wait_for()
        assert dead.inner_text().startswith("ejected")
        up = page.locator('#backends tr[data-backend="up"] td.health').inner_text()
        assert up.startswith("in rotation") and "mock-status-503 ejected" in up
        assert errors == []


def test_a_retried_request_shows_its_backoff(gateway, upstream):
    backend = FaultyUpstream()

    async def once_503(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        if len(server.requests) == 1:  # the first answer asks to retry after 50 ms
            body = b'{"error": {"message": "busy", "type": "server_error", "code": null}}'
            writer.write(http_response(503, body, extra=[("retry-after", "0.05")]))
            return True
        return await backend.handler(req, writer)

    server = upstream(once_503)
    gw = gateway(
        gateway_config(
            f'[[backends]]\nname = "up"\nurl = "{server.url}"\n'
            '[[routes]]\nmodels = ["*"]\nbackends = ["up"]\nretries = 1\n[ui]\nenabled = true\n'
        )
    )
    client = openai_client(gw.base_url, "sk-x")
    client.chat.completions.create(
        model="m", messages=MSG, extra_headers={"x-request-id": "retried"}
    )
    rec = httpx2.get(gw.url + "/_gateway/api/requests").json()["requests"][0]
    assert rec["id"] == "retried" and [a["status"] for a in rec["attempts"]] == [503, 200]
    assert rec["backoff_ms"] > 0
    kinds = [h["kind"] for h in rec["hops"] if h["kind"] in ("upstream", "backoff")]
    assert kinds == ["upstream", "backoff", "upstream"]
    drawn = next(h["dur_ms"] for h in rec["hops"] if h["kind"] == "backoff")
    assert drawn == pytest.approx(rec["backoff_ms"], abs=0.002)
    # a wait is neither the upstream's time nor the gateway's own (docs/spec.md §6)
    expected = rec["request_ms"] - rec["upstream_ms"] - rec["backoff_ms"]
    assert rec["overhead_ms"] == pytest.approx(expected, abs=0.002)
    with chromium() as (page, errors):
        page.goto(gw.url + "/_gateway/")
        wait_rows(page, 1)
        bars = rendered(page)["retried"]["bars"]
        assert [b["name"] for b in bars if b["kind"] in ("upstream", "backoff")] == [
            "upstream",
            "backoff",
            "upstream",
        ]
        assert errors == []


# ---------------------------------------------------------------- auth

ADMIN_KEY = "sk-live-view-admin-4f9c2b7e"
APP_KEY = "sk-live-view-app-81d3a6c0"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


AUTH = f"""
[auth]
mode = "keys"
[[auth.keys]]
tenant = "ops"
sha256 = "{_digest(ADMIN_KEY)}"
admin = true
[[auth.keys]]
tenant = "app"
sha256 = "{_digest(APP_KEY)}"
"""


@pytest.fixture
def keyed(gateway, mock_upstream) -> Iterator[GatewayServer]:
    with OTLPReceiver("http") as receiver:
        toml = view_config(mock_upstream.url, receiver, AUTH).replace(
            'access_log = "off"', 'access_log = "all"'
        )
        yield gateway(gateway_config(toml))


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_with_auth_on_the_view_refuses_callers_without_an_admin_key(keyed, caplog, access_log):
    caplog.set_level(logging.DEBUG)
    view = keyed.url + "/_gateway/"
    for path in ("api/requests", "api/stream", "api/backends", "api/realtime"):
        r = httpx2.get(view + path)
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "authentication_error"
        r = httpx2.get(view + path, headers=_bearer(APP_KEY))
        assert r.status_code == 403, path
        assert r.json()["error"]["type"] == "permission_error"
        assert set(r.json()["error"]) == {"message", "type", "code", "param"}
    # a session is made from a key in a header, never from the URL or an old cookie
    assert httpx2.post(view + "api/session").status_code == 401
    r = httpx2.post(view + "api/session", headers=_bearer(APP_KEY))
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = httpx2.get(view + "api/requests", params={"key": ADMIN_KEY})
    assert r.status_code in (400, 401)
    # the page itself carries no data: it loads, and asks for a key
    assert httpx2.get(view).status_code == 200
    client = openai_client(keyed.base_url, APP_KEY)
    client.chat.completions.create(model="mock-gpt-4o", messages=MSG)
    logged = server_logs(caplog, access_log)
    assert ADMIN_KEY not in logged and APP_KEY not in logged
    assert "/_gateway/" not in logged  # the view's requests are not in the access log
    assert "/v1/chat/completions" in logged  # (the access log is on: it has the model call)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def access_log() -> Iterator[Collect]:
    """The access log's lines (its logger writes to stdout and does not propagate)."""
    handler = Collect()
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def server_logs(caplog: pytest.LogCaptureFixture, access_log: Collect) -> str:
    """What the gateway (and uvicorn's WebSocket protocol) logged once the last model call's
    line is out; the test's own HTTP client logs URLs (not the gateway's doing)."""
    deadline = time.monotonic() + 5
    while not any("/v1/chat/completions" in m for m in access_log.messages):
        assert time.monotonic() < deadline, "no access log line for the model call"
        time.sleep(0.02)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith(("gateway", "uvicorn"))]
    return "\n".join(ours + access_log.messages)


def test_an_admin_key_opens_the_view_by_header_or_by_the_pages_cookie(keyed, caplog, access_log):
    caplog.set_level(logging.DEBUG)
    view = keyed.url + "/_gateway/"
    client = openai_client(keyed.base_url, APP_KEY)
    client.chat.completions.create(model="mock-gpt-4o", messages=MSG)
    r = httpx2.get(view + "api/requests", headers=_bearer(ADMIN_KEY))
    assert r.status_code == 200
    served = [rec for rec in r.json()["requests"] if rec["status"] == 200]
    assert [rec["tenant"] for rec in served] == ["app"]
    assert httpx2.get(view + "api/requests", headers=_bearer("sk-wrong")).status_code == 401
    # the browser's way: the page posts the key once, the gateway keeps it in a cookie
    r = httpx2.post(view + "api/session", headers=_bearer(ADMIN_KEY))
    assert r.status_code == 204
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/_gateway/" in cookie
    jar = {live.COOKIE: cookie.split(";")[0].split("=", 1)[1]}
    with httpx2.Client(cookies=jar, timeout=10) as c:
        assert c.get(view + "api/requests").status_code == 200
        assert c.get(view + "api/realtime").json() == {
            "open": [],
            "now": pytest.approx(time.time(), abs=60),
        }
        with c.stream("GET", view + "api/stream") as resp:
            assert resp.status_code == 200
    with chromium() as (page, errors):
        # the refused key's answer is held until the admin key is typed: on a loaded machine
        # it can come that late (a 30 s wait has run out before the rows came)
        held: list[Route] = []
        page.route("**/api/session", lambda route: held.append(route))
        page.goto(view)
        page.wait_for_selector("#signin-key")  # shown by the page's own 401
        page.fill("#signin-key", APP_KEY)
        page.click("#signin button")
        for _ in range(1000):  # let Playwright deliver the intercepted request (10 s at most)
            if held:
                break
            page.wait_for_timeout(10)
        assert held, "the sign-in request never reached the route"
        page.fill("#signin-key", ADMIN_KEY)
        held.pop().continue_()
        page.unroute("**/api/session")
        # its own message, not the 401's (which names an admin key too)
        page.wait_for_function(
            "() => document.getElementById('signin-message').textContent.includes('admin = true')"
        )
        assert page.input_value("#signin-key") == ADMIN_KEY  # the late answer did not wipe it
        page.click("#signin button")
        wait_rows(page, 1)
        assert page.is_hidden("#signin")
        # pytest's console-error capture: the refused tries above logged their 401/403
        assert [e for e in errors if "40" not in e] == []
    logged = server_logs(caplog, access_log)
    assert ADMIN_KEY not in logged and APP_KEY not in logged
    assert "/_gateway/" not in logged  # the view's requests are not in the access log
    assert "/v1/chat/completions" in logged  # (the access log is on: it has the model call)


# ---------------------------------------------------------------- config and packaging


def test_the_view_is_on_in_the_embedded_default_and_off_when_disabled(gateway, mock_upstream):
    # (when [ui] enabled is unset it follows the listen address and auth: tests/test_config.py)
    assert load_config().ui.enabled is True
    default = (ROOT / "gateway" / "default.toml").read_text()
    assert (ROOT / "config" / "gateway.toml").read_text() == default
    off = gateway(
        gateway_config(
            f'[[backends]]\nname = "up"\nurl = "{mock_upstream.url}/v1"\n'
            '[[routes]]\nmodels = ["*"]\nbackends = ["up"]\n[ui]\nenabled = false\n'
        )
    )
    assert off.app.runtime is not None and off.app.runtime.recent is None
    assert httpx2.get(off.url + "/_gateway/").status_code == 404
    assert httpx2.get(off.url + "/_gateway/api/requests").status_code == 404
    assert httpx2.get(off.url + "/_gateway/api/realtime").status_code == 404


def test_the_page_ships_inside_the_package():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["gateway"]
    ui = ROOT / "gateway" / "live" / "ui"
    shipped = sorted(p.relative_to(ROOT / "gateway") for p in ui.iterdir())
    assert {"index.html", "live.js", "live.css"} <= {p.name for p in shipped}
    for path in shipped:
        assert any(path.match(g) for g in globs), f"{path} is not in package-data"
    html = (ui / "index.html").read_text()
    assert "http://" not in html and "https://" not in html  # nothing from a CDN
