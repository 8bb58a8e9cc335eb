"""The OTLP receiver against the real OpenTelemetry SDK and its real OTLP exporters.

Whatever the exporters put on the wire (protobuf over HTTP, plain or gzip/deflate, and gRPC),
the receiver must decode exactly what the SDK recorded: names, kinds, ids, parentage, typed
attributes, status, events, resource, timestamps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GRPCSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HTTPSpanExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from tests.otlp_receiver import BlackHole, OTLPReceiver, ReceivedSpan

ROOT = Path(__file__).resolve().parent.parent
SERVICE = "otlp-receiver-test"
T0 = 1_700_000_000_123_456_789  # ns; explicit times so the receiver must echo them exactly

#: one attribute of every AnyValue type the SDK accepts (it stores sequences as tuples; the
#: receiver must give back lists)
ROOT_ATTRIBUTES: dict[str, Any] = {
    "http.request.method": "POST",
    "gateway.streamed": True,
    "gateway.cached": False,
    "http.response.status_code": 200,
    "big.negative": -(2**63),
    "gateway.overhead_ms": 1.25,
    "raw.bytes": b"\x00\xffotlp",
    "gen_ai.response.finish_reasons": ["stop", "length"],
    "ints": [1, -2, 3],
    "floats": [0.5, 2.0],
    "bools": [True, False],
    "nested": {"a": 1, "b": ["x"], "c": {"d": 2.5}},
}

REMOTE_PARENT = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=TraceState([("vendor", "v1"), ("other", "x")]),
)


def typed(value: Any) -> Any:
    """A value with its exact types, so True != 1 and 2.0 != 2 (plain == would not notice)."""
    if isinstance(value, Mapping):  # the SDK keeps nested maps as (Bounded)Attributes
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # the SDK keeps sequences as tuples
        return ("list", [typed(v) for v in value])
    return (type(value).__name__, value)


#: the attribute types every SDK version this project allows records (1.40 drops bytes and
#: maps, later versions keep them)
PLAIN_ATTRIBUTES = ROOT_ATTRIBUTES.keys() - {"raw.bytes", "nested"}


def hex_trace(span: Any) -> str:
    return format(span.get_span_context().trace_id, "032x")


def hex_span(span: Any) -> str:
    return format(span.get_span_context().span_id, "016x")


# ---------------------------------------------------------------- fixtures


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


def make_exporter(
    protocol: str, endpoint: str, compression: str | None = None, timeout: float = 5
) -> SpanExporter:
    """The SDK's own OTLP exporter for ``endpoint`` (``http://127.0.0.1:<port>``)."""
    if protocol == "http":
        http_compression = {
            None: Compression.NoCompression,
            "gzip": Compression.Gzip,
            "deflate": Compression.Deflate,
        }[compression]
        return HTTPSpanExporter(
            endpoint=endpoint + "/v1/traces", compression=http_compression, timeout=timeout
        )
    grpc_compression = {None: grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip}[
        compression
    ]
    return GRPCSpanExporter(
        endpoint=endpoint, insecure=True, compression=grpc_compression, timeout=timeout
    )


def new_provider() -> TracerProvider:
    return TracerProvider(
        resource=Resource.create({"service.name": SERVICE, "deployment.environment": "test"}),
        shutdown_on_exit=False,
    )


def record_spans(names: list[str]) -> list[ReadableSpan]:
    """Finished SDK spans, to hand to an exporter's export() directly."""
    memory = InMemorySpanExporter()
    provider = new_provider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    try:
        tracer = provider.get_tracer("tests.otlp")
        for name in names:
            tracer.start_span(name, start_time=T0).end(end_time=T0 + 1_000)
        return list(memory.get_finished_spans())
    finally:
        provider.shutdown()


def export_tree(tracer: trace.Tracer) -> dict[str, Any]:
    """A SERVER root with an INTERNAL and an ERROR CLIENT child; a span under a remote parent."""
    root = tracer.start_span(
        "POST /v1/chat/completions",
        kind=SpanKind.SERVER,
        start_time=T0,
        attributes=ROOT_ATTRIBUTES,
    )
    root_ctx = trace.set_span_in_context(root)
    hop = tracer.start_span(
        "hop auth",
        context=root_ctx,
        start_time=T0 + 100_000,
        attributes={"hop.name": "auth", "hop.index": 1, "hop.source": "gateway"},
    )
    hop.end(end_time=T0 + 350_000)
    client = tracer.start_span(
        "chat gpt-4o",
        context=root_ctx,
        kind=SpanKind.CLIENT,
        start_time=T0 + 1_000_000,
        attributes={"gen_ai.operation.name": "chat", "server.port": 8080},
    )
    client.add_event("gen_ai.first_chunk", {"chunk.index": 0}, timestamp=T0 + 2_500_000)
    client.add_event("upstream.reset", timestamp=T0 + 30_000_000)
    client.set_status(Status(StatusCode.ERROR, "upstream reset mid-stream"))
    client.end(end_time=T0 + 40_000_000)
    root.set_status(StatusCode.OK)
    root.end(end_time=T0 + 50_000_000)

    remote = tracer.start_span(
        "downstream of a traceparent",
        context=trace.set_span_in_context(NonRecordingSpan(REMOTE_PARENT)),
        kind=SpanKind.SERVER,
        start_time=T0 + 60_000_000,
    )
    remote.end(end_time=T0 + 61_000_000)
    return {"root": root, "hop": hop, "client": client, "remote": remote}


# ---------------------------------------------------------------- the round trip


@pytest.mark.parametrize(
    ("protocol", "compression"),
    [("http", None), ("http", "gzip"), ("http", "deflate"), ("grpc", None), ("grpc", "gzip")],
    ids=["http", "http-gzip", "http-deflate", "grpc", "grpc-gzip"],
)
def test_sdk_tree_round_trips(
    receiver: Callable[..., OTLPReceiver], protocol: str, compression: str | None
) -> None:
    otlp = receiver(protocol)
    provider = new_provider()
    provider.add_span_processor(
        BatchSpanProcessor(
            make_exporter(protocol, otlp.endpoint, compression), schedule_delay_millis=50
        )
    )
    try:
        sdk = export_tree(provider.get_tracer("tests.otlp", "1.2.3"))
        assert provider.force_flush()
        spans = otlp.wait_for_spans(4)
    finally:
        provider.shutdown()

    assert len(spans) == 4, otlp.dump()
    by_name = {s.name: s for s in spans}
    root = by_name["POST /v1/chat/completions"]
    hop = by_name["hop auth"]
    client = by_name["chat gpt-4o"]
    remote = by_name["downstream of a traceparent"]

    # ids and parentage, exactly the SDK's span contexts
    trace_id = hex_trace(sdk["root"])
    assert len(trace_id) == 32
    assert [root.trace_id, hop.trace_id, client.trace_id] == [trace_id] * 3
    assert root.span_id == hex_span(sdk["root"])
    assert hop.span_id == hex_span(sdk["hop"])
    assert client.span_id == hex_span(sdk["client"])
    assert root.parent_span_id is None
    assert hop.parent_span_id == root.span_id
    assert client.parent_span_id == root.span_id
    assert remote.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert remote.parent_span_id == "b7ad6b7169203331"
    assert remote.span_id == hex_span(sdk["remote"])
    assert remote.trace_state == "vendor=v1,other=x"
    # SpanFlags: the SDK sets HAS_IS_REMOTE (0x100), plus IS_REMOTE (0x200) under a remote parent
    assert root.flags == 0x100
    assert remote.flags == 0x300

    # kinds
    assert (root.kind, hop.kind, client.kind, remote.kind) == (
        "SERVER",
        "INTERNAL",
        "CLIENT",
        "SERVER",
    )

    # attributes, with their types
    # exactly what the SDK recorded, which is at least every plain type
    assert typed(root.attributes) == typed(dict(sdk["root"].attributes))
    assert root.attributes.keys() >= PLAIN_ATTRIBUTES
    for key in root.attributes:
        assert typed(root.attributes[key]) == typed(ROOT_ATTRIBUTES[key]), key
    assert typed(hop.attributes) == typed(
        {"hop.name": "auth", "hop.index": 1, "hop.source": "gateway"}
    )
    assert typed(client.attributes) == typed({"gen_ai.operation.name": "chat", "server.port": 8080})

    # status
    assert (root.status_code, root.status_message) == ("OK", "")
    assert (client.status_code, client.status_message) == ("ERROR", "upstream reset mid-stream")
    assert hop.status_code == "UNSET"

    # events
    assert client.events == [("gen_ai.first_chunk", {"chunk.index": 0}), ("upstream.reset", {})]
    assert client.event_times_ns == [T0 + 2_500_000, T0 + 30_000_000]
    assert root.events == []

    # timestamps, to the nanosecond
    assert (root.start_ns, root.end_ns) == (T0, T0 + 50_000_000)
    assert (hop.start_ns, hop.end_ns) == (T0 + 100_000, T0 + 350_000)
    assert (client.start_ns, client.end_ns) == (T0 + 1_000_000, T0 + 40_000_000)
    assert root.duration_ms == 50.0
    assert hop.duration_ms == 0.25

    # resource and scope
    for s in spans:
        assert s.resource["service.name"] == SERVICE
        assert s.resource["deployment.environment"] == "test"
        assert s.resource["telemetry.sdk.language"] == "python"
        assert (s.scope_name, s.scope_version) == ("tests.otlp", "1.2.3")

    # what the exporter sent, as the collector saw it
    assert otlp.export_requests >= 1
    assert otlp.rejected_requests == 0
    assert otlp.errors == []
    if protocol == "http":
        headers = otlp.request_headers[0]
        assert headers["content-type"] == "application/x-protobuf"
        assert headers.get("content-encoding") == compression
    else:
        # grpc-python does not show the servicer the request's grpc-encoding; it decompresses
        assert otlp.request_headers[0]["user-agent"].startswith("OTel-OTLP-Exporter-Python/")

    # trace() keeps one trace, oldest first
    assert [s.name for s in otlp.trace(trace_id.upper())] == [
        "POST /v1/chat/completions",
        "hop auth",
        "chat gpt-4o",
    ]


# ---------------------------------------------------------------- a failing collector


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_retryable_error_is_retried_not_stored_then_recovers(
    receiver: Callable[..., OTLPReceiver], protocol: str
) -> None:
    otlp = receiver(protocol, status=503, retry_after_s=0)  # retry at once: keeps the test short
    exporter = make_exporter(protocol, otlp.endpoint)
    batch = record_spans(["a", "b"])
    try:
        assert exporter.export(batch) is SpanExportResult.FAILURE
        assert otlp.export_requests > 1  # retried
        assert otlp.rejected_requests == otlp.export_requests
        assert otlp.spans == []

        otlp.status = 200
        assert exporter.export(batch) is SpanExportResult.SUCCESS
        assert sorted(s.name for s in otlp.spans) == ["a", "b"]
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_permanent_error_is_not_retried(
    receiver: Callable[..., OTLPReceiver], protocol: str
) -> None:
    otlp = receiver(protocol, status=400)
    exporter = make_exporter(protocol, otlp.endpoint)
    try:
        assert exporter.export(record_spans(["a"])) is SpanExportResult.FAILURE
        assert otlp.export_requests == 1
        assert otlp.rejected_requests == 1
        assert otlp.spans == []
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_slow_collector_times_the_exporter_out(
    receiver: Callable[..., OTLPReceiver], protocol: str
) -> None:
    otlp = receiver(protocol, delay_s=60)
    exporter = make_exporter(protocol, otlp.endpoint, timeout=0.5)
    try:
        assert exporter.export(record_spans(["slow"])) is SpanExportResult.FAILURE
        assert otlp.export_requests >= 1
    finally:
        exporter.shutdown()
        otlp.stop()  # interrupts the 60 s delay: nothing is accepted
    assert otlp.spans == []
    assert not otlp.running


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_collector_down_then_back_on_the_same_port(
    receiver: Callable[..., OTLPReceiver], protocol: str
) -> None:
    otlp = receiver(protocol)
    port = otlp.port
    otlp.stop()
    # timeout 3 s, not less: after an outage the gRPC channel sits in reconnect backoff, so the
    # next export fails fast with UNAVAILABLE once; the exporter then makes a new channel and
    # retries after ~1 s, which only happens if the export deadline leaves room for it
    exporter = make_exporter(protocol, otlp.endpoint, timeout=3)
    batch = record_spans(["while-down"])
    try:
        assert exporter.export(batch) is SpanExportResult.FAILURE
        assert otlp.export_requests == 0

        otlp.start()
        assert otlp.port == port
        assert exporter.export(batch) is SpanExportResult.SUCCESS
        assert [s.name for s in otlp.wait_for_spans(1)] == ["while-down"]
    finally:
        exporter.shutdown()


# ---------------------------------------------------------------- raw OTLP/HTTP


#: no proxies from the environment: these requests are for 127.0.0.1
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(url: str, body: bytes, content_type: str) -> tuple[int, str, bytes]:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with _opener.open(req, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.headers["Content-Type"], err.read()


def test_otlp_json_with_hex_ids(receiver: Callable[..., OTLPReceiver]) -> None:
    otlp = receiver("http")
    doc = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "json-scope"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "parentSpanId": "eee19b7ec3c1b173",
                                "name": "json span",
                                "kind": 3,
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [
                                    {"key": "n", "value": {"intValue": "42"}},
                                    {"key": "ok", "value": {"boolValue": True}},
                                ],
                                "status": {"code": 2, "message": "boom"},
                            }
                        ],
                    }
                ],
            }
        ]
    }
    status, ctype, body = post(otlp.traces_url, json.dumps(doc).encode(), "application/json")
    assert (status, ctype) == (200, "application/json")
    assert json.loads(body) == {}
    (span,) = otlp.wait_for_spans(1)
    assert span == ReceivedSpan(
        name="json span",
        kind="CLIENT",
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="eee19b7ec3c1b174",
        parent_span_id="eee19b7ec3c1b173",
        start_ns=1544712660000000000,
        end_ns=1544712661000000000,
        attributes={"n": 42, "ok": True},
        status_code="ERROR",
        status_message="boom",
        events=[],
        resource={"service.name": "json-svc"},
        scope_name="json-scope",
        trace_state="",
        flags=0,
    )


def test_protobuf_response_and_bad_requests(receiver: Callable[..., OTLPReceiver]) -> None:
    otlp = receiver("http")
    status, ctype, body = post(
        otlp.traces_url,
        trace_service_pb2.ExportTraceServiceRequest().SerializeToString(),
        "application/x-protobuf",
    )
    assert (status, ctype) == (200, "application/x-protobuf")
    assert trace_service_pb2.ExportTraceServiceResponse.FromString(body).ByteSize() == 0

    assert post(otlp.traces_url, b"\xff\xff\xff not protobuf", "application/x-protobuf")[0] == 400
    assert post(otlp.endpoint + "/v1/logs", b"", "application/x-protobuf")[0] == 404
    # metrics are decoded too (an empty request is a valid one)
    assert post(otlp.endpoint + "/v1/metrics", b"", "application/x-protobuf")[0] == 200
    assert (
        post(otlp.endpoint + "/v1/metrics", b"\xff\xff not protobuf", "application/x-protobuf")[0]
        == 400
    )
    assert post(otlp.traces_url, b"x", "text/plain")[0] == 415
    assert otlp.export_requests == 6
    assert otlp.rejected_requests == 4
    assert len(otlp.errors) == 4
    assert otlp.spans == [] and otlp.points == []


# ---------------------------------------------------------------- waiting, filtering, clearing


def test_wait_for_times_out_with_a_dump_and_clear_resets(
    receiver: Callable[..., OTLPReceiver],
) -> None:
    otlp = receiver("http")
    exporter = make_exporter("http", otlp.endpoint)
    try:
        assert exporter.export(record_spans(["only-span"])) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()

    with pytest.raises(AssertionError, match=r"(?s)1 spans, 1 export requests.*'only-span'"):
        otlp.wait_for(lambda spans: len(spans) >= 2, timeout=0.2)
    (span,) = otlp.wait_for(lambda spans: any(s.name == "only-span" for s in spans))
    assert otlp.trace(span.trace_id) == [span]
    assert otlp.trace("0" * 32) == []

    otlp.clear()
    assert otlp.spans == []
    assert otlp.export_requests == 0
    with pytest.raises(AssertionError, match="0 spans"):
        otlp.wait_for_spans(1, timeout=0.1)


def test_stop_is_idempotent_and_frees_the_port() -> None:
    otlp = OTLPReceiver("http").start()
    otlp.stop()
    otlp.stop()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", otlp.port))  # raises if the receiver still held it
    with OTLPReceiver("grpc") as g:
        assert g.running
    assert not g.running


# ---------------------------------------------------------------- the load-test sink


def test_load_sink_counts_requests_bytes_and_spans() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "loadtests" / "otlp_sink.py"), "--port", str(port), "--decode"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "sink did not start listening"
            time.sleep(0.02)

        sent = 0
        for compression in (None, "gzip"):
            exporter = make_exporter("http", f"http://127.0.0.1:{port}", compression)
            try:
                assert exporter.export(record_spans(["x", "y", "z"])) is SpanExportResult.SUCCESS
            finally:
                exporter.shutdown()
            sent += 3
        body = trace_service_pb2.ExportTraceServiceRequest().SerializeToString()
        status, _, answer = post(
            f"http://127.0.0.1:{port}/v1/traces", body, "application/x-protobuf"
        )
        assert status == 200
        assert trace_service_pb2.ExportTraceServiceResponse.FromString(answer).ByteSize() == 0
        assert post(f"http://127.0.0.1:{port}/nope", b"", "application/x-protobuf")[0] == 404

        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    totals = json.loads(out.strip().splitlines()[-1])
    assert totals["requests"] == 3
    assert totals["spans"] == sent
    assert totals["bytes"] > 0
    assert totals["errors"] == 1


# ---------------------------------------------------------------- TLS, scripted answers, gzip


def tls_post(otlp: OTLPReceiver, ctx: ssl.SSLContext) -> int:
    body = trace_service_pb2.ExportTraceServiceRequest().SerializeToString()
    req = urllib.request.Request(
        otlp.traces_url, data=body, headers={"Content-Type": "application/x-protobuf"}
    )
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    with opener.open(req, timeout=5) as resp:
        return int(resp.status)


@pytest.mark.parametrize("client_auth", [False, True], ids=["tls", "mtls"])
def test_tls_receiver_with_its_own_ca(
    receiver: Callable[..., OTLPReceiver], client_auth: bool
) -> None:
    # a plain stdlib client (with the SDK exporter 1.45 here, certificate_file did not take)
    otlp = receiver("http", tls=True, client_auth=client_auth)
    assert otlp.endpoint == f"https://127.0.0.1:{otlp.port}"
    assert otlp.ca_file and otlp.client_cert_file and otlp.client_key_file
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        tls_post(otlp, ssl.create_default_context())
    trusting = ssl.create_default_context(cafile=otlp.ca_file)
    if client_auth:
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            tls_post(otlp, trusting)  # no client certificate
        trusting.load_cert_chain(otlp.client_cert_file, otlp.client_key_file)
    assert tls_post(otlp, trusting) == 200
    assert otlp.export_requests == 1  # failed handshakes never got to a request


@pytest.mark.parametrize("client_auth", [False, True], ids=["tls", "mtls"])
def test_grpc_tls_receiver(receiver: Callable[..., OTLPReceiver], client_auth: bool) -> None:
    otlp = receiver("grpc", tls=True, client_auth=client_auth)
    assert otlp.ca_file and otlp.client_cert_file and otlp.client_key_file
    key = chain = None
    if client_auth:
        key = Path(otlp.client_key_file).read_bytes()
        chain = Path(otlp.client_cert_file).read_bytes()
    creds = grpc.ssl_channel_credentials(
        Path(otlp.ca_file).read_bytes(), private_key=key, certificate_chain=chain
    )
    exporter = GRPCSpanExporter(
        endpoint=f"127.0.0.1:{otlp.port}", credentials=creds, insecure=False, timeout=3
    )
    try:
        assert exporter.export(record_spans(["grpc-tls"])) is SpanExportResult.SUCCESS
        assert [s.name for s in otlp.wait_for_spans(1)] == ["grpc-tls"]
    finally:
        exporter.shutdown()


def test_next_statuses_then_status_and_body_sizes(receiver: Callable[..., OTLPReceiver]) -> None:
    otlp = receiver("http", next_statuses=[503, 429])
    body = trace_service_pb2.ExportTraceServiceRequest().SerializeToString()
    statuses = [post(otlp.traces_url, body, "application/x-protobuf")[0] for _ in range(3)]
    assert statuses == [503, 429, 200]
    assert otlp.next_statuses == []
    assert otlp.rejected_requests == 2
    assert otlp.body_sizes == [len(body)] * 3


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_accept_gzip_false_refuses_gzip_bodies(
    receiver: Callable[..., OTLPReceiver], protocol: str
) -> None:
    otlp = receiver(protocol, accept_gzip=False)
    gz = make_exporter(protocol, otlp.endpoint, "gzip")
    plain = make_exporter(protocol, otlp.endpoint)
    try:
        assert gz.export(record_spans(["gz"])) is SpanExportResult.FAILURE
        assert otlp.spans == []
        assert plain.export(record_spans(["plain"])) is SpanExportResult.SUCCESS
        assert [s.name for s in otlp.wait_for_spans(1)] == ["plain"]
    finally:
        gz.shutdown()
        plain.shutdown()
    if protocol == "http":
        assert otlp.errors == ["gzip request body refused (accept_gzip=False)"]


def test_black_hole_accepts_and_never_answers() -> None:
    with BlackHole() as hole:
        with socket.create_connection(("127.0.0.1", hole.port), timeout=2) as conn:
            conn.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            conn.settimeout(0.3)
            with pytest.raises(TimeoutError):
                conn.recv(1)
        deadline = time.monotonic() + 5
        while hole.connections < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hole.connections == 1
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", hole.port))  # stopped: the port is free again
