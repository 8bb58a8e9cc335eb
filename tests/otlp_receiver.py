"""A real OTLP trace receiver for the tests: OTLP/HTTP (protobuf or JSON) and OTLP/gRPC.

It listens on 127.0.0.1, decodes every ``ExportTraceServiceRequest`` it is sent into
:class:`ReceivedSpan` values (and every ``ExportMetricsServiceRequest``, ``/v1/metrics`` or
``MetricsService/Export``, into :class:`ReceivedPoint` values) and answers like a collector would.
``status`` and ``delay_s`` make it a failing or a slow collector (both can be changed while it
runs; ``next_statuses`` answers the next calls with those statuses first); ``retry_after_s`` adds
the ``Retry-After`` header (HTTP) or a ``google.rpc.RetryInfo`` trailer (gRPC) that the OTel
exporters honour as their retry backoff. ``tls=True`` serves TLS with a certificate from its own
trustme CA (``ca_file`` is what ``OTEL_EXPORTER_OTLP_CERTIFICATE`` names), ``client_auth=True``
also requires a client certificate (``client_cert_file`` / ``client_key_file``),
``accept_gzip=False`` refuses gzip request bodies (for gRPC the only way to see that a client
compressed: grpc-python hides grpc-encoding from the servicer). Request headers (gRPC: metadata)
and on-the-wire body sizes are recorded. It is stopped by its own handle; ``start()`` after
``stop()`` binds the same port again, so a test can take the collector down and bring it back.
:class:`BlackHole` accepts connections and never answers.

    with OTLPReceiver("grpc") as otlp:
        ...  # point OTEL_EXPORTER_OTLP_ENDPOINT (or the exporter) at otlp.endpoint
        spans = otlp.wait_for_spans(3)
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import http.server
import json
import shutil
import socket
import ssl
import tempfile
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
import trustme
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status as RpcStatus
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = [
    "METRICS_PATH",
    "TRACES_PATH",
    "BlackHole",
    "OTLPReceiver",
    "ReceivedPoint",
    "ReceivedSpan",
    "decode_any_value",
    "decode_export_request",
    "parse_json_request",
]

TRACES_PATH = "/v1/traces"
METRICS_PATH = "/v1/metrics"
_MAX_BODY = 64 * 1024 * 1024  # the Python exporters' default max_request_size

_KIND_NAMES = {v: k.removeprefix("SPAN_KIND_") for k, v in trace_pb2.Span.SpanKind.items()}
_STATUS_NAMES = {v: k.removeprefix("STATUS_CODE_") for k, v in trace_pb2.Status.StatusCode.items()}

#: HTTP status the receiver is told to answer -> the gRPC code it answers instead
_HTTP_TO_GRPC = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


# ---------------------------------------------------------------- decoded spans


@dataclass
class ReceivedSpan:
    name: str
    kind: str  # "SERVER" | "CLIENT" | "INTERNAL" | "PRODUCER" | "CONSUMER" | "UNSPECIFIED"
    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    parent_span_id: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: str  # "UNSET" | "OK" | "ERROR"
    status_message: str
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    scope_name: str
    trace_state: str
    flags: int  # OTLP SpanFlags (the Python SDK sets only the is-remote bits, not the sampled bit)
    event_times_ns: list[int] = field(default_factory=list)  # parallel to ``events``
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # trace, span, attrs
    scope_version: str = ""

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    def __str__(self) -> str:
        parent = self.parent_span_id or "-"
        return (
            f"{self.name!r} {self.kind} trace={self.trace_id} span={self.span_id} "
            f"parent={parent} status={self.status_code}"
        )


@dataclass
class ReceivedPoint:
    """One histogram data point of an exported metric."""

    name: str
    unit: str
    attributes: dict[str, Any]
    count: int
    sum: float
    bucket_counts: list[int]
    explicit_bounds: list[float]
    min: float
    max: float
    temporality: int  # 2 = cumulative
    resource: dict[str, Any]
    scope_name: str


def decode_metrics_request(
    req: metrics_service_pb2.ExportMetricsServiceRequest,
) -> list[ReceivedPoint]:
    """Every histogram data point of a metrics export request (other kinds are not sent)."""
    points: list[ReceivedPoint] = []
    for rm in req.resource_metrics:
        resource = _decode_attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                hist = metric.histogram
                points.extend(
                    ReceivedPoint(
                        name=metric.name,
                        unit=metric.unit,
                        attributes=_decode_attributes(dp.attributes),
                        count=dp.count,
                        sum=dp.sum,
                        bucket_counts=list(dp.bucket_counts),
                        explicit_bounds=list(dp.explicit_bounds),
                        min=dp.min,
                        max=dp.max,
                        temporality=hist.aggregation_temporality,
                        resource=resource,
                        scope_name=sm.scope.name,
                    )
                    for dp in hist.data_points
                )
    return points


def decode_any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a Python value (an unset value is ``None``)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _decode_attributes(value.kvlist_value.values)
    return getattr(value, which)


def _decode_attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in kvs:
        out[kv.key] = decode_any_value(kv.value)
    return out


def _hex_or_none(raw: bytes) -> str | None:
    return raw.hex() if raw and any(raw) else None


def _decode_span(s: trace_pb2.Span, resource: dict[str, Any], scope: Any) -> ReceivedSpan:
    return ReceivedSpan(
        name=s.name,
        kind=_KIND_NAMES.get(s.kind, str(s.kind)),
        trace_id=s.trace_id.hex(),
        span_id=s.span_id.hex(),
        parent_span_id=_hex_or_none(s.parent_span_id),
        start_ns=s.start_time_unix_nano,
        end_ns=s.end_time_unix_nano,
        attributes=_decode_attributes(s.attributes),
        status_code=_STATUS_NAMES.get(s.status.code, str(s.status.code)),
        status_message=s.status.message,
        events=[(e.name, _decode_attributes(e.attributes)) for e in s.events],
        resource=dict(resource),
        scope_name=scope.name,
        trace_state=s.trace_state,
        flags=s.flags,
        event_times_ns=[e.time_unix_nano for e in s.events],
        links=[
            (ln.trace_id.hex(), ln.span_id.hex(), _decode_attributes(ln.attributes))
            for ln in s.links
        ],
        scope_version=scope.version,
    )


def decode_export_request(req: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Every span of an export request, in the order they were sent."""
    spans: list[ReceivedSpan] = []
    for rs in req.resource_spans:
        resource = _decode_attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            spans.extend(_decode_span(s, resource, ss.scope) for s in ss.spans)
    return spans


# OTLP/JSON differs from the protobuf JSON mapping in one way that matters: ids are hex, not base64.
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _hex_ids_to_base64(node: Any) -> None:
    if isinstance(node, dict):
        for key, val in node.items():
            if key in _ID_FIELDS and isinstance(val, str):
                node[key] = base64.b64encode(bytes.fromhex(val)).decode()
            else:
                _hex_ids_to_base64(val)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


def parse_json_request(body: bytes) -> trace_service_pb2.ExportTraceServiceRequest:
    doc = json.loads(body)
    _hex_ids_to_base64(doc)
    req = trace_service_pb2.ExportTraceServiceRequest()
    json_format.ParseDict(doc, req, ignore_unknown_fields=True)
    return req


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- the receiver


class OTLPReceiver:
    """A real OTLP trace receiver on ``127.0.0.1:<port>`` (``protocol`` "http" or "grpc").

    ``status``: the HTTP status to answer (2xx = accept; for gRPC mapped to a status code, e.g.
    503 -> UNAVAILABLE, 429 -> RESOURCE_EXHAUSTED, 400 -> INVALID_ARGUMENT). Spans are only stored
    when the answer is a success. ``delay_s``: wait that long before answering (a slow or, with a
    large value, black-holed collector; ``stop()`` cuts the wait short). ``retry_after_s``: with an
    error status, ask the exporter to retry after that many seconds. ``next_statuses``: answer
    the next export calls with these statuses, one per call, before ``status`` again (e.g.
    ``[503, 503]`` then success). ``tls`` / ``client_auth`` / ``accept_gzip``: see the module.
    """

    def __init__(
        self,
        protocol: Literal["http", "grpc"] = "http",
        *,
        status: int = 200,
        delay_s: float = 0.0,
        retry_after_s: float | None = None,
        next_statuses: list[int] | None = None,
        tls: bool = False,
        client_auth: bool = False,
        accept_gzip: bool = True,
    ) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        if client_auth and not tls:
            raise ValueError("client_auth needs tls")
        self.protocol: Literal["http", "grpc"] = protocol
        self.status = status
        self.delay_s = delay_s
        self.retry_after_s = retry_after_s
        self.next_statuses: list[int] = list(next_statuses or ())
        self.tls = tls
        self.client_auth = client_auth
        self.accept_gzip = accept_gzip
        self.port = _free_port()
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        #: PEM files of the receiver's own CA and of a client certificate it issued (tls only)
        self.ca_file: str | None = None
        self.client_cert_file: str | None = None
        self.client_key_file: str | None = None
        self._server_cert: trustme.LeafCert | None = None
        self._ca: trustme.CA | None = None
        if tls:
            self._make_certificates()
        self._cond = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self._points: list[ReceivedPoint] = []
        self._export_requests = 0
        self._rejected_requests = 0
        self._errors: list[str] = []
        self._requests_meta: list[dict[str, str]] = []
        self._body_sizes: list[int] = []
        self._stopping = threading.Event()
        self._http: _HTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc: grpc.Server | None = None
        self._grpc_pool: futures.ThreadPoolExecutor | None = None

    def _make_certificates(self) -> None:
        ca = trustme.CA()
        self._ca = ca
        self._server_cert = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert("otlp-test-client")
        folder = tempfile.mkdtemp(prefix="otlp-receiver-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        self.ca_file = f"{folder}/ca.pem"
        ca.cert_pem.write_to_path(self.ca_file)
        self.client_cert_file = f"{folder}/client.pem"
        self.client_key_file = f"{folder}/client.key"
        for pem in client.cert_chain_pems:
            pem.write_to_path(self.client_cert_file, append=True)
        client.private_key_pem.write_to_path(self.client_key_file)

    def _ssl_context(self) -> ssl.SSLContext:
        assert self._server_cert is not None and self._ca is not None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_cert.configure_cert(ctx)
        if self.client_auth:
            ctx.verify_mode = ssl.CERT_REQUIRED
            self._ca.configure_trust(ctx)
        return ctx

    def _grpc_credentials(self) -> grpc.ServerCredentials:
        assert self._server_cert is not None and self._ca is not None
        key = self._server_cert.private_key_pem.bytes()
        chain = b"".join(p.bytes() for p in self._server_cert.cert_chain_pems)
        return grpc.ssl_server_credentials(
            [(key, chain)],
            root_certificates=self._ca.cert_pem.bytes() if self.client_auth else None,
            require_client_auth=self.client_auth,
        )

    # ------------------------------------------------------------ lifecycle

    @property
    def traces_url(self) -> str:
        """The full OTLP/HTTP traces URL (what ``OTLPSpanExporter(endpoint=...)`` wants)."""
        return self.endpoint + TRACES_PATH

    @property
    def running(self) -> bool:
        return self._http is not None or self._grpc is not None

    def start(self) -> OTLPReceiver:
        if self.running:
            raise RuntimeError("receiver already started")
        self._stopping.clear()
        if self.protocol == "http":
            server = _HTTPServer(("127.0.0.1", self.port), _Handler)
            server.receiver = self
            if self.tls:
                # the handshake happens in the handler thread (_Handler.setup), not in accept()
                server.socket = self._ssl_context().wrap_socket(
                    server.socket, server_side=True, do_handshake_on_connect=False
                )
            self._http = server
            self._http_thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"otlp-http-{self.port}",
                daemon=True,
            )
            self._http_thread.start()
        else:
            self._grpc_pool = futures.ThreadPoolExecutor(
                max_workers=8, thread_name_prefix=f"otlp-grpc-{self.port}"
            )
            options: list[tuple[str, Any]] = [
                # grpc sets SO_REUSEPORT by default: another server could share the port
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", _MAX_BODY),
            ]
            if not self.accept_gzip:
                # bit 0 = identity only: a gzip message is refused with UNIMPLEMENTED
                options.append(("grpc.compression_enabled_algorithms_bitset", 1))
            server = grpc.server(self._grpc_pool, options=options)
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), server)
            metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
                _MetricsServicer(self), server
            )
            address = f"127.0.0.1:{self.port}"
            if self.tls:
                bound = server.add_secure_port(address, self._grpc_credentials())
            else:
                bound = server.add_insecure_port(address)
            if bound != self.port:
                server.stop(None)
                self._grpc_pool.shutdown(wait=False)
                raise OSError(f"could not bind OTLP/gRPC receiver to 127.0.0.1:{self.port}")
            server.start()
            self._grpc = server
        return self

    def stop(self) -> None:
        """Stop listening and close every connection (idempotent). Received spans are kept."""
        self._stopping.set()  # cuts any delay_s wait short
        if self._http is not None:
            self._http.shutdown()
            self._http.close_all_connections()
            self._http.server_close()
            self._http = None
        if self._http_thread is not None:
            self._http_thread.join(5)
            self._http_thread = None
        if self._grpc is not None:
            self._grpc.stop(grace=0.5).wait(5)
            self._grpc = None
        if self._grpc_pool is not None:
            self._grpc_pool.shutdown(wait=True, cancel_futures=True)
            self._grpc_pool = None

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ what was received

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._cond:
            return list(self._spans)

    @property
    def points(self) -> list[ReceivedPoint]:
        """Every metric data point received, in arrival order (cumulative points repeat)."""
        with self._cond:
            return list(self._points)

    def wait_for_points(
        self, predicate: Callable[[list[ReceivedPoint]], bool], timeout: float = 10.0
    ) -> list[ReceivedPoint]:
        """Wait until ``predicate(points)`` holds; return the points. AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            snapshot = self.points
            if predicate(snapshot):
                return snapshot
            if time.monotonic() >= deadline:
                names = sorted({p.name for p in snapshot})
                raise AssertionError(f"OTLP receiver: metrics condition not met: {names}")
            with self._cond:
                self._cond.wait(0.05)

    @property
    def export_requests(self) -> int:
        """Export calls received (every retry counts; rejected and undecodable ones too)."""
        with self._cond:
            return self._export_requests

    @property
    def rejected_requests(self) -> int:
        """Export calls answered with an error (the ``status`` given, or 400 for a bad body)."""
        with self._cond:
            return self._rejected_requests

    @property
    def errors(self) -> list[str]:
        """Why requests could not be decoded (wrong path, content type, encoding, bad protobuf)."""
        with self._cond:
            return list(self._errors)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """Headers (lower-cased; gRPC: metadata) of each export call, in arrival order."""
        with self._cond:
            return [dict(h) for h in self._requests_meta]

    @property
    def body_sizes(self) -> list[int]:
        """OTLP/HTTP: each export call's body size as sent (compressed, when it was)."""
        with self._cond:
            return list(self._body_sizes)

    def clear(self) -> None:
        with self._cond:
            self._spans.clear()
            self._points.clear()
            self._export_requests = 0
            self._rejected_requests = 0
            self._errors.clear()
            self._requests_meta.clear()
            self._body_sizes.clear()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of one trace, oldest first."""
        trace_id = trace_id.lower()
        return sorted((s for s in self.spans if s.trace_id == trace_id), key=lambda s: s.start_ns)

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0
    ) -> list[ReceivedSpan]:
        """Wait until ``predicate(spans)`` holds; return the spans. AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            snapshot = self.spans
            if predicate(snapshot):
                return snapshot
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with self._cond:
                if len(self._spans) == len(snapshot):
                    self._cond.wait(min(remaining, 0.05))
        raise AssertionError(f"OTLP receiver: condition not met after {timeout} s\n{self.dump()}")

    def wait_for_spans(self, count: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        return self.wait_for(lambda spans: len(spans) >= count, timeout)

    def dump(self) -> str:
        with self._cond:
            spans = list(self._spans)
            lines = [
                f"{self.protocol} receiver at {self.endpoint}: {len(spans)} spans, "
                f"{self._export_requests} export requests ({self._rejected_requests} rejected)"
            ]
            lines += [f"  error: {e}" for e in self._errors[-10:]]
        lines += [f"  {s}" for s in spans]
        return "\n".join(lines)

    # ------------------------------------------------------------ used by the servers

    def _record(self, meta: dict[str, str], body_size: int | None = None) -> None:
        with self._cond:
            self._export_requests += 1
            self._requests_meta.append(meta)
            if body_size is not None:
                self._body_sizes.append(body_size)

    def _next_status(self) -> int:
        with self._cond:
            return self.next_statuses.pop(0) if self.next_statuses else self.status

    def _reject(self, error: str | None = None) -> None:
        with self._cond:
            self._rejected_requests += 1
            if error is not None:
                self._errors.append(error)

    def _accept(self, req: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = decode_export_request(req)
        with self._cond:
            self._spans.extend(spans)
            self._cond.notify_all()

    def _accept_metrics(self, req: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        points = decode_metrics_request(req)
        with self._cond:
            self._points.extend(points)
            self._cond.notify_all()

    def _wait_delay(self) -> bool:
        """Sleep ``delay_s``; False when ``stop()`` interrupted the wait."""
        delay = self.delay_s
        return not (delay > 0 and self._stopping.wait(delay))


# ---------------------------------------------------------------- OTLP/HTTP


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    receiver: OTLPReceiver

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_all_connections(self, timeout: float = 5.0) -> None:
        """Wake handler threads parked on idle keep-alive connections; wait until they closed."""
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._conns_lock:
                if not self._conns:
                    return
            time.sleep(0.01)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-answer is not the test's business


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a collector
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            try:
                self.request.do_handshake()
            except (OSError, ssl.SSLError):
                self.close_connection = True  # a client that does not trust us, or no cert
            self.request.settimeout(None)
        super().setup()

    def handle(self) -> None:
        with contextlib.suppress(OSError):  # e.g. the failed handshake above
            super().handle()

    def do_POST(self) -> None:
        receiver = self.server.receiver
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        receiver._record({k.lower(): v for k, v in self.headers.items()}, len(body))

        path = self.path.split("?", 1)[0]
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        is_json = ctype == "application/json"
        if path not in (TRACES_PATH, METRICS_PATH):
            receiver._reject(f"POST {self.path}: not {TRACES_PATH}")
            self._answer(404, is_json, "not found")
            return
        if path == METRICS_PATH:
            self._metrics(body, ctype)
            return
        if ctype not in ("application/x-protobuf", "application/json"):
            receiver._reject(f"unsupported Content-Type {ctype!r}")
            self._answer(415, is_json, f"unsupported Content-Type {ctype!r}")
            return
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        if encoding == "gzip" and not receiver.accept_gzip:
            receiver._reject("gzip request body refused (accept_gzip=False)")
            self._answer(415, is_json, "gzip not accepted")
            return
        try:
            raw = _decompress(body, encoding)
            if is_json:
                req = parse_json_request(raw)
            else:
                req = trace_service_pb2.ExportTraceServiceRequest.FromString(raw)
        except Exception as exc:
            receiver._reject(f"undecodable body ({ctype}): {exc!r}")
            self._answer(400, is_json, f"bad request: {exc}")
            return

        if not receiver._wait_delay():
            self.close_connection = True
            return  # stopped while delaying: hang up without an answer
        status = receiver._next_status()
        if 200 <= status < 300:
            receiver._accept(req)
            self._answer(status, is_json, "")
        else:
            receiver._reject()
            self._answer(status, is_json, f"receiver configured to answer {status}")

    def _metrics(self, body: bytes, ctype: str) -> None:
        """OTLP/HTTP metrics: protobuf only (what the gateway sends)."""
        receiver = self.server.receiver
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        try:
            raw = _decompress(body, encoding)
            if ctype != "application/x-protobuf":
                raise ValueError(f"unsupported Content-Type {ctype!r}")
            req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(raw)
        except Exception as exc:
            receiver._reject(f"undecodable metrics body ({ctype}): {exc!r}")
            self._answer(400, False, f"bad request: {exc}")
            return
        status = receiver._next_status()
        if 200 <= status < 300:
            receiver._accept_metrics(req)
        else:
            receiver._reject()
        self._answer(status, False, f"receiver configured to answer {status}")

    def do_GET(self) -> None:
        self._answer(405, False, "POST only")

    def _answer(self, status: int, is_json: bool, message: str) -> None:
        if 200 <= status < 300:
            msg: Any = trace_service_pb2.ExportTraceServiceResponse()
        else:
            msg = RpcStatus(code=_HTTP_TO_GRPC.get(status, grpc.StatusCode.UNKNOWN).value[0])
            msg.message = message
        if is_json:
            payload = json_format.MessageToJson(msg).encode()
            ctype = "application/json"
        else:
            payload = msg.SerializeToString()
            ctype = "application/x-protobuf"
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            retry_after = self.server.receiver.retry_after_s
            if retry_after is not None and status >= 300:
                self.send_header("Retry-After", f"{retry_after:g}")
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()
        except OSError:
            self.close_connection = True


# ---------------------------------------------------------------- OTLP/gRPC


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        receiver = self.receiver
        receiver._record({k.lower(): str(v) for k, v in context.invocation_metadata()})
        if not receiver._wait_delay():
            context.abort(grpc.StatusCode.UNAVAILABLE, "receiver stopping")
        status = receiver._next_status()
        if 200 <= status < 300:
            receiver._accept(request)
            return trace_service_pb2.ExportTraceServiceResponse()
        receiver._reject()
        if receiver.retry_after_s is not None:
            delay = receiver.retry_after_s
            info = RetryInfo(retry_delay=Duration(seconds=int(delay), nanos=int((delay % 1) * 1e9)))
            context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
        code = _HTTP_TO_GRPC.get(status, grpc.StatusCode.UNKNOWN)
        context.abort(code, f"receiver configured to answer {status}")
        raise AssertionError("unreachable: abort() raises")


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(
        self,
        request: metrics_service_pb2.ExportMetricsServiceRequest,
        context: grpc.ServicerContext,
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        receiver = self.receiver
        receiver._record({k.lower(): str(v) for k, v in context.invocation_metadata()})
        status = receiver._next_status()
        if 200 <= status < 300:
            receiver._accept_metrics(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()
        receiver._reject()
        context.abort(_HTTP_TO_GRPC.get(status, grpc.StatusCode.UNKNOWN), "configured")
        raise AssertionError("unreachable: abort() raises")


# ---------------------------------------------------------------- a black-holed collector


class BlackHole:
    """Listens on 127.0.0.1, accepts every connection, never reads from it nor answers.

    What a collector behind a dead proxy or a stopped process with a live port looks like: TCP
    connects, TLS/HTTP/2 handshakes and requests all hang until the client's own timeout.
    ``connections`` counts the accepted ones. Stopped by its own handle (closes everything).
    """

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, name=f"otlp-blackhole-{self.port}", daemon=True
        )

    def start(self) -> BlackHole:
        self._thread.start()
        return self

    def _serve(self) -> None:
        self._sock.settimeout(0.05)
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.setblocking(False)
            with self._lock:
                self.connections += 1
                self._conns.append(conn)
        # (what clients send stays in the kernel's buffers: never read, never answered)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._sock.close()

    def __enter__(self) -> BlackHole:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
