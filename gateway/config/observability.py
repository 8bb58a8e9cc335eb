"""What the gateway tells: ``[tracing]``, ``[logging]``, ``[metrics]`` and ``[ui]``, the live
view (docs/spec.md §7, §17, §18)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class TracingConfig:
    exporter: Literal["otlp", "console", "none"] = "none"
    #: OTLP endpoint; unset = OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT or the SDK default
    endpoint: str | None = None
    protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    sample_ratio: float = 1.0
    service_name: str = "llm-gateway"
    trust_incoming: bool = True
    #: what of prompts and completions goes on spans (docs/spec.md §7): "none" (they never
    #: leave the process), "metadata" (roles, part types, tool names and sizes: never text) or
    #: "full" (the text, redacted and capped); ``true``/``false`` are read as "full"/"none"
    capture_content: Literal["none", "metadata", "full"] = "none"
    #: the most bytes of text one content attribute carries (the rest is cut, and the span says
    #: so with ``gateway.content.truncated``)
    capture_max_bytes: int = 16384
    #: regular expressions whose matches are replaced by ``[REDACTED]`` in captured content
    #: before it leaves the process (spans, the live view); compiled once at startup
    redact: tuple[str, ...] = ()
    #: the attribute names of model calls: the OpenTelemetry GenAI conventions, or those plus
    #: OpenInference's (Arize Phoenix)
    conventions: Literal["genai", "openinference"] = "genai"
    #: export the GenAI client metrics (gen_ai.client.*) over OTLP beside the spans
    metrics: bool = False
    #: how often the GenAI client metrics are exported, in seconds
    metrics_interval_s: float = 60.0
    #: requests traced whatever ``sample_ratio`` and the parent say, decided as the request
    #: ends (docs/spec.md §7): "error" (a 5xx answer), "client_error" (a 4xx), "cut" (a stream
    #: cut after it began, or a client gone), "slow:<duration>" ("slow:1s", "slow:250ms")
    keep: tuple[str, ...] = ()
    #: where spans are batched, wrapped and exported: a thread of the serving process, or an
    #: exporter process of its own fed through a bounded socket buffer (docs/spec.md §7)
    export_in: Literal["thread", "process"] = "thread"
    #: export queue bounds: a dead collector costs dropped spans, never request time. Bigger
    #: batches than the SDK's 512: each export call costs ~0.7 ms of CPU however small it is
    max_queue_size: int = 8192
    max_export_batch_size: int = 2048
    schedule_delay_ms: float = 1000.0
    export_timeout_s: float = 5.0
    #: on shutdown, wait at most this long for the exporter to flush
    shutdown_timeout_s: float = 3.0
    #: the keys of this section the file or a ``GATEWAY__TRACING__*`` variable wrote (filled
    #: by :func:`build_config`): those win over ``OTEL_*`` variables (docs/spec.md §7)
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    def is_explicit(self, name: str) -> bool:
        """Whether key ``name`` was written (or, for a section built in code, differs from its
        default): then it wins over the matching ``OTEL_*`` variable."""
        if name in self.explicit:
            return True
        default = next(f.default for f in dataclasses.fields(self) if f.name == name)
        return bool(getattr(self, name) != default)


KEEP_KINDS = ("error", "client_error", "cut")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0}


def keep_rule(rule: str) -> tuple[str, float]:
    """One ``[tracing] keep`` rule as (kind, slow threshold in seconds; 0 for the others).
    ValueError (with what is wrong) for a rule that is none of them."""
    kind, sep, arg = rule.strip().partition(":")
    if kind in KEEP_KINDS and not sep:
        return kind, 0.0
    if kind != "slow" or not sep:
        raise ValueError(
            f"expected one of {', '.join(KEEP_KINDS)} or slow:<duration>, got {rule!r}"
        )
    for unit in ("ms", "s", "m"):
        if arg.endswith(unit):
            try:
                seconds = float(arg[: -len(unit)]) * _UNITS[unit]
            except ValueError:
                break
            if seconds > 0 and seconds == seconds and seconds != float("inf"):
                return "slow", seconds
            break
    raise ValueError(f"slow needs a positive duration like 1s or 250ms, got {rule!r}")


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    access_log: Literal["all", "sampled", "off"] = "sampled"
    slow_ms: float = 500.0
    sample_ratio: float = 0.01
    level: Literal["debug", "info", "warning", "error"] = "info"
    #: "json": every line the process writes is one JSON object; "text": for humans
    format: Literal["json", "text"] = "json"


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    #: GET /metrics (false: no endpoint and no per-request cost)
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class UiConfig:
    #: the built-in live view (docs/spec.md §18). Unset: on when the gateway listens on loopback
    #: only or auth is on, off otherwise (resolved by :func:`build_config`)
    enabled: bool | None = None
    path: str = "/_gateway/"
    #: requests kept in its ring buffer
    recent: int = 500


__all__ = ["KEEP_KINDS", "LoggingConfig", "MetricsConfig", "TracingConfig", "UiConfig", "keep_rule"]
