"""OTLP/HTTP: ``POST`` ``application/x-protobuf`` over one keep-alive ``http.client``
connection, from the export thread (https://opentelemetry.io/docs/specs/otlp/#otlphttp)."""

from __future__ import annotations

import base64
import contextlib
import email.utils
import http.client
import math
import socket
import ssl
import threading
import time
import zlib
from urllib.parse import unquote, urlsplit

from gateway.telemetry.export.retrying import _OK, Outcome, _RetryingExporter
from gateway.telemetry.export.rpc_status import _rpc_status_message
from gateway.telemetry.export.settings import (
    USER_AGENT,
    ExportConfigError,
    OTLPSettings,
    display_url,
)

#: the collector's answer is an ExportTraceServiceResponse (or a google.rpc.Status): small
_MAX_RESPONSE = 64 * 1024

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
        self,
        settings: OTLPSettings,
        *,
        backoff_s: float = 1.0,
        max_backoff_s: float = 32.0,
        what: str = "span",
    ) -> None:
        parts = urlsplit(settings.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ExportConfigError(
                f"OTLP/HTTP endpoint must be an http(s) URL, got {display_url(settings.endpoint)!r}"
            )
        self.endpoint = display_url(settings.endpoint)
        super().__init__(settings, backoff_s, max_backoff_s, what)
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
