"""Span export off the event loop: a bounded queue, one worker thread, OTLP sent by hand.

A request only ever appends its encoded spans to a bounded deque (O(1), no lock, no I/O);
when the queue is full the spans are dropped and counted, never waited for. The worker thread
frames batches into an ``ExportTraceServiceRequest`` (:mod:`gateway.telemetry.otlp`) and sends
those bytes itself -- no private API of an OpenTelemetry exporter (docs/spec.md §7):

- OTLP/HTTP: ``POST`` ``application/x-protobuf`` over a keep-alive ``http.client`` connection;
- OTLP/gRPC: the unary ``TraceService/Export`` call on a ``grpc`` channel with identity (bytes)
  serializers; ``grpcio`` is the optional extra ``llm-gateway[grpc]``.

Both honour the ``OTEL_EXPORTER_OTLP_(TRACES_)*`` variables (endpoint, headers, timeout,
compression, certificate, client key/certificate, protocol, insecure) wherever the config leaves
the key at its default, and retry retryable failures with exponential backoff and jitter (or the
collector's ``Retry-After`` / ``RetryInfo``) within the export timeout. A dead, black-holed or slow
collector therefore costs dropped spans, not request latency; shutdown waits a bounded time, and
the exporter's error log says so once, then at most once a minute.

Spec: https://opentelemetry.io/docs/specs/otlp/ (retries, status codes) and
https://opentelemetry.io/docs/specs/otel/protocol/exporter/ (the variables).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import email.utils
import http.client
import importlib
import json
import logging
import math
import os
import random
import re
import socket
import ssl
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from gateway import __version__
from gateway.config import TracingConfig
from gateway.telemetry.otlp import RequestEncoder, frame_spans

log = logging.getLogger("gateway.tracing")

#: OTLP/HTTP traces path, appended to a base endpoint (OTEL_EXPORTER_OTLP_ENDPOINT, the config)
TRACES_PATH = "/v1/traces"
GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318" + TRACES_PATH
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
USER_AGENT = f"llm-gateway/{__version__}"
#: the collector's answer is an ExportTraceServiceResponse (or a google.rpc.Status): small
_MAX_RESPONSE = 64 * 1024
_DEFAULTS = TracingConfig()

Protocol_ = Literal["http/protobuf", "grpc"]


class ExportConfigError(ValueError):
    """The exporter cannot be built as configured (grpcio missing, unreadable certificate...).

    The message names the setting (config key or environment variable) and what to do.
    """


class EncodedBatch:
    """A framed ExportTraceServiceRequest and how many spans it holds."""

    __slots__ = ("count", "data")

    def __init__(self, data: bytes, count: int) -> None:
        self.data = data
        self.count = count


class BatchExporter(Protocol):
    #: where batches go, for /readyz and log lines (never with credentials)
    endpoint: str

    def export(self, batch: EncodedBatch) -> bool: ...

    def shutdown(self) -> None: ...


# ---------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class OTLPSettings:
    """Where and how to export, resolved from the config and ``OTEL_EXPORTER_OTLP_*``.

    ``endpoint``: for HTTP the full traces URL; for gRPC the channel target as a URL (its scheme
    says TLS or not) or a bare ``host:port`` (then ``insecure`` decides).
    """

    protocol: Protocol_
    endpoint: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = _DEFAULTS.export_timeout_s
    compression: Literal["gzip", "none"] = "none"
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    insecure: bool = False


def _env_var(env: Mapping[str, str], key: str) -> tuple[str, str] | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<key>`` else ``OTEL_EXPORTER_OTLP_<key>``: (name, value)."""
    for name in (f"OTEL_EXPORTER_OTLP_TRACES_{key}", f"OTEL_EXPORTER_OTLP_{key}"):
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token
#: visible ASCII, space and tab: what both an HTTP/1.1 header and gRPC ASCII metadata carry
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")


def parse_headers(value: str, source: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` (W3C baggage style, percent-encoded) as lower-cased header pairs.

    A malformed entry is skipped with a warning naming its position, never its text (header
    values are credentials).

    >>> parse_headers("api-key=s%20cret, X-Team = a", "OTEL_EXPORTER_OTLP_HEADERS")
    (('api-key', 's cret'), ('x-team', 'a'))
    """
    out: list[tuple[str, str]] = []
    for index, item in enumerate(value.split(","), 1):
        if not item.strip():
            continue
        raw_name, sep, raw_value = item.partition("=")
        name = unquote(raw_name).strip().lower()
        header_value = unquote(raw_value).strip()
        if not sep or not _HEADER_NAME.fullmatch(name) or not _HEADER_VALUE.fullmatch(header_value):
            log.warning("%s: entry %d is not a valid name=value header; ignored", source, index)
            continue
        out.append((name, header_value))
    return tuple(out)


def _parse_timeout(name: str, value: str) -> float | None:
    """Milliseconds (the OTel spec's unit for OTEL_EXPORTER_OTLP_TIMEOUT) as seconds."""
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not math.isfinite(ms) or ms <= 0:
        # the OTel spec: an unparsable value is warned about and treated as unset
        log.warning("%s=%r is not a positive number of milliseconds; ignored", name, value)
        return None
    return ms / 1000


def _file(name: str, path: str) -> str:
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ExportConfigError(f"{name}: {path!r} is not a readable file")
    return path


def _http_endpoint(cfg: TracingConfig, env: Mapping[str, str]) -> str:
    if cfg.endpoint is not None:
        # like Jaeger's docs, the config names the collector's base URL (...:4318); a URL with
        # a path is used as is
        if urlsplit(cfg.endpoint).path in ("", "/"):
            return cfg.endpoint.rstrip("/") + TRACES_PATH
        return cfg.endpoint
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces  # the per-signal URL is used as is (OTel spec)
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + TRACES_PATH
    return DEFAULT_HTTP_ENDPOINT


def resolve_settings(cfg: TracingConfig, env: Mapping[str, str]) -> OTLPSettings:
    """The exporter's settings: an explicit config key wins, else ``OTEL_*``, else the default.

    A config key counts as explicit when the file (or ``GATEWAY__TRACING__*``) wrote it, even
    with its default value (docs/spec.md §7). Unparsable
    numbers and unknown enum values in ``OTEL_*`` are warned about and ignored (OTel spec);
    files that cannot be read are an :class:`ExportConfigError`.
    """
    protocol: Protocol_ = cfg.protocol
    if not cfg.is_explicit("protocol") and (got := _env_var(env, "PROTOCOL")) is not None:
        name, value = got
        if value in ("http/protobuf", "grpc"):
            protocol = value  # type: ignore[assignment]  # checked just above
        else:
            log.warning(
                "%s=%r is not supported (http/protobuf | grpc); using %s", name, value, protocol
            )

    if protocol == "grpc":
        endpoint = cfg.endpoint or (
            env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
            or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            or DEFAULT_GRPC_ENDPOINT
        )
    else:
        endpoint = _http_endpoint(cfg, env)

    timeout = cfg.export_timeout_s
    if not cfg.is_explicit("export_timeout_s") and (got := _env_var(env, "TIMEOUT")) is not None:
        timeout = _parse_timeout(*got) or timeout

    headers: tuple[tuple[str, str], ...] = ()
    if (got := _env_var(env, "HEADERS")) is not None:
        headers = parse_headers(got[1], got[0])

    compression = _compression(env)
    certificate = None
    if (got := _env_var(env, "CERTIFICATE")) is not None:
        certificate = _file(*got)
    key, cert = _client_pair(env)
    insecure = False
    if (got := _env_var(env, "INSECURE")) is not None:
        insecure = got[1].lower() == "true"
    return OTLPSettings(
        protocol=protocol,
        endpoint=endpoint,
        headers=headers,
        timeout_s=timeout,
        compression=compression,
        certificate=certificate,
        client_key=_file(*key) if key else None,
        client_certificate=_file(*cert) if cert else None,
        insecure=insecure,
    )


def _compression(env: Mapping[str, str]) -> Literal["gzip", "none"]:
    if (got := _env_var(env, "COMPRESSION")) is not None:
        name, value = got
        if value.lower() == "gzip":
            return "gzip"
        if value.lower() != "none":
            log.warning("%s=%r is not supported (gzip | none); not compressing", name, value)
    return "none"


def _client_pair(
    env: Mapping[str, str],
) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """The mutual-TLS key and certificate variables: both or neither."""
    key = _env_var(env, "CLIENT_KEY")
    cert = _env_var(env, "CLIENT_CERTIFICATE")
    if (key is None) != (cert is None):
        have = (key or cert or ("", ""))[0]
        raise ExportConfigError(
            f"{have} is set but not its pair: mutual TLS needs both "
            "OTEL_EXPORTER_OTLP_(TRACES_)CLIENT_KEY and "
            "OTEL_EXPORTER_OTLP_(TRACES_)CLIENT_CERTIFICATE"
        )
    return key, cert


def display_url(url: str) -> str:
    """``url`` without userinfo, query or fragment (it is shown in /readyz and in logs)."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return url.rpartition("@")[2]
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


# ---------------------------------------------------------------- what failed, said rarely


class FailureLog:
    """The exporter's error log: the first failure at once, then one summary per ``interval_s``.

    A collector that is down for an hour costs ~60 log lines, not one per batch; the recovery
    is logged too. Reasons never include header values (they are never put in one).
    """

    def __init__(
        self,
        endpoint: str,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._endpoint = endpoint
        self._interval = interval_s
        self._clock = clock
        self._failing = False
        self._last_report = 0.0
        self._batches = 0
        self._spans = 0

    @property
    def failing(self) -> bool:
        return self._failing

    def failure(self, spans: int, reason: str) -> None:
        now = self._clock()
        self._batches += 1
        self._spans += spans
        if not self._failing:
            self._failing = True
            log.warning(
                "span export to %s failed: %s; %d spans dropped (further failures are "
                "reported at most every %g s)",
                self._endpoint,
                reason,
                spans,
                self._interval,
            )
        elif now - self._last_report >= self._interval:
            log.warning(
                "span export to %s still failing: %d batches (%d spans) dropped in the last "
                "%.0f s; last error: %s",
                self._endpoint,
                self._batches,
                self._spans,
                now - self._last_report,
                reason,
            )
        else:
            return
        self._last_report = now
        self._batches = self._spans = 0

    def success(self) -> None:
        if self._failing:
            self._failing = False
            log.info(
                "span export to %s recovered (%d batches, %d spans dropped since the last report)",
                self._endpoint,
                self._batches,
                self._spans,
            )
            self._batches = self._spans = 0


# ---------------------------------------------------------------- the retry loop


@dataclass(frozen=True, slots=True)
class Outcome:
    """One export attempt: accepted, or why not and whether (and when) to try again."""

    ok: bool
    reason: str = ""
    retryable: bool = False
    retry_after_s: float | None = None


_OK = Outcome(ok=True)


class _RetryingExporter:
    """Retries on retryable outcomes, exponential backoff with jitter, all within the timeout."""

    endpoint: str
    protocol: str

    def __init__(self, settings: OTLPSettings, backoff_s: float, max_backoff_s: float) -> None:
        self._timeout = settings.timeout_s
        self._backoff = backoff_s
        self._max_backoff = max_backoff_s
        self._closed = threading.Event()
        self._log = FailureLog(self.endpoint)

    def _attempt(self, data: bytes, timeout_s: float) -> Outcome:
        raise NotImplementedError

    def _payload(self, data: bytes) -> bytes:
        return data

    def export(self, batch: EncodedBatch) -> bool:
        """Send one batch; False (logged, rate limited) when it could not be delivered in time."""
        if self._closed.is_set():
            return False
        deadline = time.monotonic() + self._timeout
        data = self._payload(batch.data)
        attempt = 0
        while True:
            try:
                outcome = self._attempt(data, max(deadline - time.monotonic(), 0.001))
            except Exception as exc:  # a bug or an unexpected library error: not retried
                outcome = Outcome(ok=False, reason=f"{type(exc).__name__}: {exc}")
            if outcome.ok:
                self._log.success()
                return True
            if not outcome.retryable or self._closed.is_set():
                break
            delay = outcome.retry_after_s
            if delay is None:
                delay = min(self._backoff * 2**attempt, self._max_backoff)
                delay *= random.uniform(0.8, 1.2)  # jitter: replicas must not retry in step
            attempt += 1
            if time.monotonic() + delay >= deadline:
                outcome = Outcome(
                    ok=False, reason=f"{outcome.reason} (gave up after {attempt} attempts)"
                )
                break
            if self._closed.wait(delay):
                break
        self._log.failure(batch.count, outcome.reason)
        return False


# ---------------------------------------------------------------- OTLP/HTTP

#: OTLP/HTTP: "429, 502, 503, 504 ... the client SHOULD retry" (otlp spec, Failures)
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})


def _retry_after(value: str | None) -> float | None:
    """``Retry-After``: delay-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    with contextlib.suppress(ValueError):
        seconds = float(value)  # the RFC says an integer; a decimal is taken as meant
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _client_ssl_context(settings: OTLPSettings) -> ssl.SSLContext:
    """System trust, or only ``certificate`` when set; the client pair for mutual TLS."""
    try:
        ctx = ssl.create_default_context(cafile=settings.certificate)
        if settings.client_certificate and settings.client_key:
            ctx.load_cert_chain(settings.client_certificate, settings.client_key)
    except (ssl.SSLError, OSError) as exc:
        raise ExportConfigError(
            f"OTEL_EXPORTER_OTLP_(TRACES_)CERTIFICATE / CLIENT_*: cannot load: {exc}"
        ) from exc
    return ctx


class HTTPExporter(_RetryingExporter):
    """OTLP/HTTP with protobuf bodies over one keep-alive connection, from the worker thread."""

    protocol = "http/protobuf"

    def __init__(
        self, settings: OTLPSettings, *, backoff_s: float = 1.0, max_backoff_s: float = 32.0
    ) -> None:
        parts = urlsplit(settings.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ExportConfigError(
                f"OTLP/HTTP endpoint must be an http(s) URL, got {display_url(settings.endpoint)!r}"
            )
        self.endpoint = display_url(settings.endpoint)
        super().__init__(settings, backoff_s, max_backoff_s)
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._ssl = _client_ssl_context(settings) if parts.scheme == "https" else None
        self._gzip = settings.compression == "gzip"
        headers = {"user-agent": USER_AGENT}
        if parts.username is not None:
            userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers["authorization"] = "Basic " + base64.b64encode(userinfo.encode()).decode()
        headers.update(settings.headers)
        headers["content-type"] = "application/x-protobuf"
        if self._gzip:
            headers["content-encoding"] = "gzip"
        self._headers = headers
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _payload(self, data: bytes) -> bytes:
        # level 6 (zlib's default): ~all of level 9's gain on span batches at a fraction of the CPU
        return zlib.compress(data, 6, wbits=31) if self._gzip else data

    def _connection(self, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conn = self._conn
            if conn is None:
                if self._ssl is not None:
                    conn = http.client.HTTPSConnection(
                        self._host, self._port, timeout=timeout_s, context=self._ssl
                    )
                else:
                    conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
                self._conn = conn
                return conn, False
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn, conn.sock is not None

    def _drop_connection(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            if conn.sock is not None:
                with contextlib.suppress(OSError):  # wakes a worker blocked on this socket
                    conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _attempt(self, data: bytes, timeout_s: float) -> Outcome:
        for _ in range(2):
            conn, reused = self._connection(timeout_s)
            try:
                conn.request("POST", self._path, data, self._headers)
                resp = conn.getresponse()
                body = resp.read(_MAX_RESPONSE)
                if not resp.isclosed() or resp.will_close:  # more than we read, or closing
                    self._drop_connection()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self._drop_connection()
                if reused and not self._closed.is_set():
                    continue  # the collector closed an idle keep-alive connection: at once again
                return Outcome(ok=False, reason=_describe(exc), retryable=True)
            except ssl.SSLCertVerificationError as exc:
                self._drop_connection()  # will not fix itself within the deadline
                return Outcome(ok=False, reason=_describe(exc))
            except (OSError, http.client.HTTPException) as exc:
                # refused, unreachable, reset, timeout: retryable (a timeout has spent the
                # deadline, so it ends the loop anyway)
                self._drop_connection()
                return Outcome(ok=False, reason=_describe(exc), retryable=True)
            status = resp.status
            if 200 <= status < 300:
                return _OK
            reason = f"HTTP {status} {resp.reason}".rstrip() + _rpc_status_message(body)
            return Outcome(
                ok=False,
                reason=reason,
                retryable=status in RETRYABLE_HTTP,
                retry_after_s=_retry_after(resp.getheader("retry-after")),
            )
        raise AssertionError("unreachable")

    def shutdown(self) -> None:
        self._closed.set()
        self._drop_connection()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _varints(data: bytes) -> dict[int, int | bytes]:
    """The top-level fields of a protobuf message: varints and length-delimited bytes."""
    fields: dict[int, int | bytes] = {}
    pos, end = 0, len(data)

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while pos < end:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
        raise ValueError("truncated varint")

    while pos < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number] = varint()
        elif wire == 2:
            length = varint()
            fields[number] = data[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return fields


def _rpc_status_message(body: bytes) -> str:
    """The ``message`` of a ``google.rpc.Status`` error body (field 2), if there is one."""
    try:
        message = _varints(body).get(2)
    except (ValueError, IndexError):
        return ""
    if isinstance(message, bytes) and message:
        return ": " + message[:200].decode("utf-8", "replace")
    return ""


def _retry_info_delay(raw: bytes) -> float | None:
    """``google.rpc.RetryInfo{Duration retry_delay = 1}``, ``Duration{seconds = 1, nanos = 2}``."""
    try:
        duration = _varints(raw).get(1)
        if not isinstance(duration, bytes):
            return None
        parts = _varints(duration)
    except (ValueError, IndexError):
        return None
    seconds, nanos = parts.get(1, 0), parts.get(2, 0)
    if not isinstance(seconds, int) or not isinstance(nanos, int):
        return None
    return max(0.0, seconds + nanos / 1e9)


# ---------------------------------------------------------------- OTLP/gRPC


def import_grpc() -> Any:
    """``grpc``, or an :class:`ExportConfigError` saying which extra to install."""
    try:
        return importlib.import_module("grpc")
    except ImportError as exc:
        raise ExportConfigError(
            "tracing.protocol = 'grpc' (or OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL=grpc) needs "
            "grpcio, which is not installed: pip install 'llm-gateway[grpc]'"
        ) from exc


#: otlp spec, "OTLP/gRPC Throttling" and "Failures": retryable codes (RESOURCE_EXHAUSTED
#: only when the server says when, with RetryInfo)
_RETRYABLE_GRPC = (
    "CANCELLED",
    "DEADLINE_EXCEEDED",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNAVAILABLE",
    "DATA_LOSS",
)


def grpc_target(settings: OTLPSettings) -> tuple[str, bool]:
    """The channel target (``host:port``) and whether it is TLS (spec: scheme, else INSECURE)."""
    endpoint = settings.endpoint
    if "://" not in endpoint:
        return endpoint.rstrip("/"), not settings.insecure
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ExportConfigError(
            f"OTLP/gRPC endpoint must be http(s)://host:port or host:port, got "
            f"{display_url(endpoint)!r}"
        )
    return parts.netloc.rpartition("@")[2], parts.scheme == "https"


class GRPCExporter(_RetryingExporter):
    """OTLP/gRPC: the unary Export call with the encoded bytes as the request message."""

    protocol = "grpc"

    def __init__(
        self, settings: OTLPSettings, *, backoff_s: float = 1.0, max_backoff_s: float = 32.0
    ) -> None:
        grpc = import_grpc()
        target, secure = grpc_target(settings)
        self.endpoint = f"{'https' if secure else 'http'}://{target}"
        super().__init__(settings, backoff_s, max_backoff_s)
        self._grpc = grpc
        self._target = target
        self._options = [
            ("grpc.primary_user_agent", USER_AGENT),
            # a channel of its own subchannels: the fresh channel made after an UNAVAILABLE
            # must not inherit a shared subchannel sitting in reconnect backoff
            ("grpc.use_local_subchannel_pool", 1),
            # grpc's reconnect backoff grows to 120 s by default
            ("grpc.max_reconnect_backoff_ms", 5000),
        ]
        self._compression = (
            grpc.Compression.Gzip
            if settings.compression == "gzip"
            else grpc.Compression.NoCompression
        )
        self._credentials = (
            grpc.ssl_channel_credentials(
                root_certificates=_read(settings.certificate),
                private_key=_read(settings.client_key),
                certificate_chain=_read(settings.client_certificate),
            )
            if secure
            else None
        )
        self._metadata = settings.headers
        self._retryable = frozenset(getattr(grpc.StatusCode, name) for name in _RETRYABLE_GRPC)
        self._lock = threading.Lock()
        self._channel: Any = None
        self._export: Any = None
        self._open_channel()

    def _open_channel(self) -> None:
        grpc = self._grpc
        if self._credentials is not None:
            channel = grpc.secure_channel(
                self._target, self._credentials, self._options, self._compression
            )
        else:
            channel = grpc.insecure_channel(self._target, self._options, self._compression)
        with self._lock:
            old, self._channel = self._channel, channel
            # no serializers: grpc sends the bytes as the message, hands back the reply's bytes
            self._export = channel.unary_unary(GRPC_METHOD)
        if old is not None:
            old.close()
        if self._closed.is_set():
            channel.close()

    def _attempt(self, data: bytes, timeout_s: float) -> Outcome:
        try:
            self._export(data, timeout=timeout_s, metadata=self._metadata)
        except self._grpc.RpcError as exc:
            # the raised error is also a grpc.Call: code(), details(), trailing_metadata()
            code = _call(exc, "code")
            details = str(_call(exc, "details") or "")
            delay: float | None = None
            for key, value in _call(exc, "trailing_metadata") or ():
                if key == "google.rpc.retryinfo-bin" and isinstance(value, bytes):
                    delay = _retry_info_delay(value)
            name = getattr(code, "name", str(code))
            retryable = code in self._retryable or (
                code == self._grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None
            )
            reason = f"gRPC {name}" + (f": {details[:200]}" if details else "")
            if code == self._grpc.StatusCode.UNAVAILABLE and not self._closed.is_set():
                # after an outage a channel waits out its reconnect backoff (seconds) and fails
                # every call fast meanwhile; a new channel connects at once (the SDK does this)
                self._open_channel()
            return Outcome(ok=False, reason=reason, retryable=retryable, retry_after_s=delay)
        return _OK

    def shutdown(self) -> None:
        self._closed.set()
        with self._lock:
            channel = self._channel
        channel.close()  # cancels an export in flight


def _call(obj: object, method: str) -> Any:
    fn = getattr(obj, method, None)
    return fn() if callable(fn) else None


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------- console


class ConsoleExporter:
    """Prints each exported span as one JSON line (decoded by the official proto classes)."""

    endpoint = "console"
    protocol = "console"

    def __init__(self, out: IO[str] | None = None) -> None:
        self._out = out or sys.stdout

    def export(self, batch: EncodedBatch) -> bool:
        from google.protobuf.json_format import MessageToDict
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        req = ExportTraceServiceRequest.FromString(batch.data)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self._out.write(json.dumps(MessageToDict(s)) + "\n")
        self._out.flush()
        return True

    def shutdown(self) -> None:
        return None


def make_exporter(cfg: TracingConfig, env: Mapping[str, str] | None = None) -> BatchExporter:
    """The exporter ``cfg`` asks for, with ``OTEL_EXPORTER_OTLP_*`` from ``env`` (os.environ).

    Raises :class:`ExportConfigError` when it cannot be built (e.g. grpc without grpcio).
    """
    if cfg.exporter == "console":
        return ConsoleExporter()
    if cfg.exporter != "otlp":
        raise ValueError(f"tracing.exporter = {cfg.exporter!r} has no exporter")
    settings = resolve_settings(cfg, os.environ if env is None else env)
    if settings.protocol == "grpc":
        return GRPCExporter(settings)
    return HTTPExporter(settings)


# ---------------------------------------------------------------- the queue


class SpanQueue:
    """Bounded queue + worker thread (the BatchSpanProcessor's job, for encoded spans).

    An entry is one request's spans, already framed as ``ScopeSpans.spans`` fields
    (:func:`gateway.telemetry.otlp.frame_spans`) with their count: a batch is one join of
    entries. The queue's size and the batch size count spans; a request's spans are queued
    (and dropped, when the queue is full) together."""

    def __init__(
        self,
        exporter: BatchExporter,
        encoder: RequestEncoder,
        *,
        max_queue_size: int,
        max_batch: int,
        schedule_delay_s: float,
    ) -> None:
        self.exporter = exporter
        self._encoder = encoder
        self._queue: collections.deque[tuple[bytes, int]] = collections.deque()
        self._max_queue = max_queue_size
        self._max_batch = max_batch
        self._delay = schedule_delay_s
        self._wake = threading.Event()
        self._stopping = False
        #: spans ever queued (written on the event loop only) and taken (by the worker only):
        #: their difference is what is queued, with no lock and no shared read-modify-write
        self._queued = 0
        self._taken = 0
        #: counters, read by /readyz and (later) /metrics
        self.dropped = 0
        self.exported = 0
        self.failed = 0
        self.last_error_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="gateway-span-export", daemon=True)
        self._thread.start()

    def put(self, spans: Sequence[bytes]) -> None:
        """Called on the event loop: never blocks, never does I/O."""
        if spans:
            self.put_framed(frame_spans(spans), len(spans))

    def put_framed(self, block: bytes, count: int) -> None:
        """Queue ``count`` spans framed by :func:`~gateway.telemetry.otlp.frame_spans` (all or,
        when the queue has no room for them, none: counted as dropped)."""
        queued = self._queued - self._taken
        if queued + count > self._max_queue:
            self.dropped += count
            return
        self._queue.append((block, count))
        self._queued += count
        # set once per batch, not on every put until the worker runs: Event.set takes a lock
        # and notifies (issue 32)
        if queued + count >= self._max_batch and not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            while self._queue:
                self._export_some()
                if self._stopping:
                    break
            if self._stopping:
                return

    def _export_some(self) -> None:
        q = self._queue
        blocks: list[bytes] = []
        count = 0
        # only this thread takes entries (but shutdown() after its timeout: hence the guards)
        while q:
            try:
                if blocks and count + q[0][1] > self._max_batch:
                    break
                block, n = q.popleft()
            except IndexError:
                break
            blocks.append(block)
            count += n
        if not blocks:
            return
        self._taken += count
        ok = False
        try:
            ok = self.exporter.export(EncodedBatch(self._encoder.request_framed(blocks), count))
        except Exception:  # the exporter must never kill the worker
            log.exception("span export failed")
        if ok:
            self.exported += count
        else:
            self.failed += count
            self.last_error_at = time.time()

    def state(self) -> str:
        if self.last_error_at is not None and time.time() - self.last_error_at < 30:
            return "failing"
        return "ok"

    def shutdown(self, timeout_s: float) -> None:
        """Flush what is queued, waiting at most ``timeout_s``; then drop the rest."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        while self._queue and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.01)
        self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        left = 0
        while self._queue:
            left += self._queue.popleft()[1]
        self._taken += left
        self.dropped += left
        try:
            self.exporter.shutdown()
        except Exception:
            log.exception("span exporter shutdown failed")
