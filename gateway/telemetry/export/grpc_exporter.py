"""OTLP/gRPC: the unary ``TraceService/Export`` call with the encoded bytes as the request
message, on a ``grpc`` channel (the optional extra ``llm-gateway[grpc]``)."""

from __future__ import annotations

import importlib
import threading
from typing import Any
from urllib.parse import urlsplit

from gateway.telemetry.export.retrying import _OK, Outcome, _RetryingExporter
from gateway.telemetry.export.rpc_status import _retry_info_delay
from gateway.telemetry.export.settings import (
    GRPC_METHOD,
    USER_AGENT,
    ExportConfigError,
    OTLPSettings,
    display_url,
)


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
        self,
        settings: OTLPSettings,
        *,
        backoff_s: float = 1.0,
        max_backoff_s: float = 32.0,
        method: str = GRPC_METHOD,
        what: str = "span",
    ) -> None:
        grpc = import_grpc()
        target, secure = grpc_target(settings)
        self.endpoint = f"{'https' if secure else 'http'}://{target}"
        super().__init__(settings, backoff_s, max_backoff_s, what)
        #: the unary method: TraceService/Export, or MetricsService/Export
        self._method = method
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
            self._export = channel.unary_unary(self._method)
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
