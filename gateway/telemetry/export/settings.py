"""The exporter's settings: the ``[tracing]`` config and ``OTEL_EXPORTER_OTLP_(TRACES_)*``
resolved into one :class:`OTLPSettings` (an explicit config key wins, else the variable, else
the default), and the types every exporter shares."""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from gateway import __version__
from gateway.config import TracingConfig

log = logging.getLogger("gateway.tracing")

#: OTLP/HTTP traces path, appended to a base endpoint (OTEL_EXPORTER_OTLP_ENDPOINT, the config)
TRACES_PATH = "/v1/traces"
GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
#: the same for the GenAI client metrics (docs/spec.md §7)
METRICS_PATH = "/v1/metrics"
METRICS_GRPC_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
Signal = Literal["traces", "metrics"]
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318" + TRACES_PATH
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
USER_AGENT = f"llm-gateway/{__version__}"
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


def _env_var(env: Mapping[str, str], key: str, signal: Signal = "traces") -> tuple[str, str] | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<key>`` (``_METRICS_`` for metrics) else
    ``OTEL_EXPORTER_OTLP_<key>``: (name, value)."""
    for name in (f"OTEL_EXPORTER_OTLP_{signal.upper()}_{key}", f"OTEL_EXPORTER_OTLP_{key}"):
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


def _http_endpoint(cfg: TracingConfig, env: Mapping[str, str], signal: Signal = "traces") -> str:
    path = TRACES_PATH if signal == "traces" else METRICS_PATH
    if cfg.endpoint is not None:
        # like Jaeger's docs, the config names the collector's base URL (...:4318); a URL with
        # a path is used as is (for traces; the metrics go to the same base's /v1/metrics)
        parts = urlsplit(cfg.endpoint)
        if parts.path in ("", "/"):
            return cfg.endpoint.rstrip("/") + path
        if signal == "metrics":
            return urlunsplit((parts.scheme, parts.netloc, METRICS_PATH, "", ""))
        return cfg.endpoint
    own = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
    if own:
        return own  # the per-signal URL is used as is (OTel spec)
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + path
    return "http://localhost:4318" + path


def resolve_settings(
    cfg: TracingConfig, env: Mapping[str, str], signal: Signal = "traces"
) -> OTLPSettings:
    """The exporter's settings: an explicit config key wins, else ``OTEL_*``, else the default.

    A config key counts as explicit when the file (or ``GATEWAY__TRACING__*``) wrote it, even
    with its default value (docs/spec.md §7). Unparsable
    numbers and unknown enum values in ``OTEL_*`` are warned about and ignored (OTel spec);
    files that cannot be read are an :class:`ExportConfigError`. ``signal``: whose per-signal
    variables (``OTEL_EXPORTER_OTLP_TRACES_*`` or ``_METRICS_*``) and path apply.
    """
    protocol: Protocol_ = cfg.protocol
    if not cfg.is_explicit("protocol") and (got := _env_var(env, "PROTOCOL", signal)) is not None:
        name, value = got
        if value in ("http/protobuf", "grpc"):
            protocol = value  # type: ignore[assignment]  # checked just above
        else:
            log.warning(
                "%s=%r is not supported (http/protobuf | grpc); using %s", name, value, protocol
            )

    if protocol == "grpc":
        endpoint = cfg.endpoint or (
            env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
            or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            or DEFAULT_GRPC_ENDPOINT
        )
    else:
        endpoint = _http_endpoint(cfg, env, signal)

    timeout = cfg.export_timeout_s
    if (
        not cfg.is_explicit("export_timeout_s")
        and (got := _env_var(env, "TIMEOUT", signal)) is not None
    ):
        timeout = _parse_timeout(*got) or timeout

    headers: tuple[tuple[str, str], ...] = ()
    if (got := _env_var(env, "HEADERS", signal)) is not None:
        headers = parse_headers(got[1], got[0])

    compression = _compression(env, signal)
    certificate = None
    if (got := _env_var(env, "CERTIFICATE", signal)) is not None:
        certificate = _file(*got)
    key, cert = _client_pair(env, signal)
    insecure = False
    if (got := _env_var(env, "INSECURE", signal)) is not None:
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


def _compression(env: Mapping[str, str], signal: Signal) -> Literal["gzip", "none"]:
    if (got := _env_var(env, "COMPRESSION", signal)) is not None:
        name, value = got
        if value.lower() == "gzip":
            return "gzip"
        if value.lower() != "none":
            log.warning("%s=%r is not supported (gzip | none); not compressing", name, value)
    return "none"


def _client_pair(
    env: Mapping[str, str], signal: Signal
) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """The mutual-TLS key and certificate variables: both or neither."""
    key = _env_var(env, "CLIENT_KEY", signal)
    cert = _env_var(env, "CLIENT_CERTIFICATE", signal)
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
