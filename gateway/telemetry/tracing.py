"""Spans from the Timeline (docs/spec.md §7): one SERVER root, one span per hop, one CLIENT per
attempt.

Spans are not opened and closed live around the code: every timing is already on the
request's :class:`~gateway.context.Timeline`, so when the request is done the whole span tree
is written in one go with explicit start/end times (edge hops are reconstructed from headers
anyway). That keeps the hot path free of span objects and context switches, and makes the
spans agree exactly with ``Server-Timing`` and the access log. Only the ids are chosen up front:
the trace id (continued from an incoming ``traceparent`` when trusted), the root span id (for
``traceresponse``) and one span id per attempt (injected upstream as its ``traceparent``).

Sampling is ``ParentBased(TraceIdRatioBased(sample_ratio))``, computed with the SDK's own bound,
and then, as the request ends, ``[tracing] keep`` rules (an error, a cut, a slow request) export a
request that decision left out (:meth:`Tracing.keep`). A request neither decision keeps has no span
built for it at all.
The span tree itself is written by :mod:`gateway.telemetry.spans`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import re
from collections.abc import Iterator, Mapping
from typing import Any

from gateway import __version__
from gateway.config import TracingConfig
from gateway.config.observability import keep_rule
from gateway.context import Attempt, RequestContext, TraceContext
from gateway.errors import UpstreamStreamError
from gateway.telemetry import otlp
from gateway.telemetry.content import ContentPolicy
from gateway.telemetry.export import (
    BatchExporter,
    SpanQueue,
    make_exporter,
    make_metrics_exporter,
)
from gateway.telemetry.export.process import ProcessExport
from gateway.telemetry.genai_metrics import GenAIMetrics
from gateway.telemetry.spans import EdgeHop, build_framed
from gateway.telemetry.spans.conventions import SpanStyle
from gateway.telemetry.spans.record import record, record_spans

_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_TRACE_ID_LIMIT = (1 << 64) - 1
SCOPE_NAME = "llm-gateway"
log = logging.getLogger("gateway.tracing")


def parse_traceparent(value: bytes) -> tuple[int, int, bool] | None:
    """W3C Trace Context §3.2: (trace_id, parent_id, sampled), or None when invalid."""
    m = _TRACEPARENT.fullmatch(value.strip().lower())
    if m is None:
        return None
    version, trace_id, parent_id, flags, rest = m.groups()
    if version == b"ff" or (version == b"00" and rest):
        return None
    tid, pid = int(trace_id, 16), int(parent_id, 16)
    if tid == 0 or pid == 0:
        return None
    return tid, pid, bool(int(flags, 16) & 1)


#: :meth:`Tracing.keep`'s answers: not traced, sampled up front, kept by a ``keep`` rule
DROPPED, SAMPLED, KEPT = 0, 1, 2
_getrandbits = random.getrandbits
#: W3C Trace Context §3.3: list members of printable ASCII, at most 512 characters in all
_TRACESTATE = re.compile(r"[\x20-\x2b\x2d-\x7e]+(,[\x20-\x2b\x2d-\x7e]*)*")


def _valid_state(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 512 and bool(_TRACESTATE.fullmatch(value))


def _span_id() -> int:
    while True:
        sid = _getrandbits(64)
        if sid:
            return sid


def effective_config(cfg: TracingConfig, env: Mapping[str, str]) -> tuple[TracingConfig, bool]:
    """``cfg`` with the ``OTEL_*`` variables applied where it leaves a key at its default
    (docs/spec.md §7: an explicit config key wins), and whether sampling follows a parent.

    ``OTEL_SDK_DISABLED=true`` turns tracing off whatever the file says;
    ``OTEL_TRACES_EXPORTER`` (otlp | console | none) applies to ``exporter``;
    ``OTEL_TRACES_SAMPLER`` / ``_ARG`` to ``sample_ratio`` (``always_on``, ``always_off``,
    ``traceidratio`` and their ``parentbased_`` forms).
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return dataclasses.replace(cfg, exporter="none"), True
    changes: dict[str, Any] = {}
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not cfg.is_explicit("exporter") and exporter in ("otlp", "console", "none"):
        changes["exporter"] = exporter
    parent_based = True
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not cfg.is_explicit("sample_ratio") and sampler:
        ratio = _sampler_ratio(sampler, env.get("OTEL_TRACES_SAMPLER_ARG"))
        if ratio is not None:
            changes["sample_ratio"] = ratio
            parent_based = sampler.startswith("parentbased_")
    return (dataclasses.replace(cfg, **changes) if changes else cfg), parent_based


def _sampler_ratio(sampler: str, arg: str | None) -> float | None:
    name = sampler.removeprefix("parentbased_")
    if name == "always_on":
        return 1.0
    if name == "always_off":
        return 0.0
    if name == "traceidratio":
        try:
            ratio = float(arg) if arg is not None else 1.0
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a ratio in 0..1: using 1.0", arg)
            return 1.0
        return ratio
    log.warning("OTEL_TRACES_SAMPLER=%r is not supported: using the config's sampler", sampler)
    return None


def resource_attributes(cfg: TracingConfig) -> dict[str, otlp.AttrValue]:
    """``service.name`` and friends: an explicit config key wins, then ``OTEL_SERVICE_NAME``,
    then ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``, then the config default."""
    from opentelemetry.sdk.resources import Resource

    given: dict[str, str] = {"service.version": __version__}
    if cfg.is_explicit("service_name"):
        given["service.name"] = cfg.service_name
    # Resource.create adds the SDK's defaults, OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
    attrs: dict[str, otlp.AttrValue] = {
        k: v
        for k, v in Resource.create(given).attributes.items()
        if isinstance(v, str | bool | int | float)
    }
    if str(attrs.get("service.name", "")).startswith("unknown_service"):
        attrs["service.name"] = cfg.service_name
    return attrs


class KeepRules:
    """``[tracing] keep``: which finished requests are traced whatever the sampler said."""

    __slots__ = ("any", "client_error", "cut", "error", "slow_s")

    def __init__(self, rules: tuple[str, ...]) -> None:
        parsed = [keep_rule(r) for r in rules]  # checked at config load
        kinds = {kind for kind, _ in parsed}
        self.error = "error" in kinds
        self.client_error = "client_error" in kinds
        self.cut = "cut" in kinds
        slow = [s for kind, s in parsed if kind == "slow"]
        self.slow_s = min(slow) if slow else None
        self.any = bool(parsed)

    def matches(self, ctx: RequestContext) -> bool:
        answer = ctx.answer
        status = answer.status
        if self.cut and (status == 499 or isinstance(answer.error, UpstreamStreamError)):
            return True
        if self.error and status >= 500:
            return True
        if self.client_error and 400 <= status < 499 and not answer.expected:
            return True
        return self.slow_s is not None and ctx.request_time() >= self.slow_s


class Tracing:
    """Per-app tracing state: sampler bound, encoder, export queue. No per-request state."""

    def __init__(
        self,
        cfg: TracingConfig,
        *,
        edge_hop_count: int = 0,
        cache_backend: str = "memory",
        auth_mode: str = "off",
        exporter: BatchExporter | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

        environ = os.environ if env is None else env
        cfg, self._parent_based = effective_config(cfg, environ)
        self.cfg = cfg
        #: hop.index of auth is edge_hop_count + 1, of router + 2 (docs/spec.md §7)
        self.edge_hop_count = edge_hop_count
        self.cache_backend = cache_backend
        self.auth_mode = auth_mode
        self.enabled = cfg.exporter != "none"
        #: what of prompts and completions goes on spans, and under which names (§7)
        self.content = ContentPolicy.of(cfg)
        self.capture_content = self.content.capturing
        self.style = SpanStyle(self.content, cfg.conventions == "openinference")
        self._bound = TraceIdRatioBased.get_bound_for_rate(cfg.sample_ratio)
        self._trust = cfg.trust_incoming
        self._keep = KeepRules(cfg.keep)
        #: requests exported by a keep rule that the ratio or the parent left out
        self.kept = 0
        self.queue: SpanQueue | ProcessExport | None = None
        #: the GenAI client metrics over OTLP (``metrics = true``, docs/spec.md §7)
        self.genai_metrics: GenAIMetrics | None = None
        if not self.enabled:
            return
        resource = resource_attributes(cfg)
        encoder = otlp.RequestEncoder(resource, SCOPE_NAME, __version__)
        if cfg.export_in == "process" and exporter is None:
            make_exporter(cfg, environ).shutdown()  # its config errors are startup errors here
            self.queue = ProcessExport(cfg, resource)
            self._metrics(cfg, resource, environ)
            return
        if exporter is None:
            exporter = make_exporter(cfg, environ)  # ExportConfigError: a startup error
        self.queue = SpanQueue(
            exporter,
            encoder,
            max_queue_size=cfg.max_queue_size,
            max_batch=cfg.max_export_batch_size,
            schedule_delay_s=cfg.schedule_delay_ms / 1000,
        )
        self._metrics(cfg, resource, environ)

    def _metrics(
        self, cfg: TracingConfig, resource: dict[str, otlp.AttrValue], environ: Mapping[str, str]
    ) -> None:
        if cfg.metrics and cfg.exporter == "otlp":
            metrics_exporter = make_metrics_exporter(cfg, environ)
            self.genai_metrics = GenAIMetrics(metrics_exporter, resource, cfg.metrics_interval_s)
        elif cfg.metrics:
            log.warning("tracing.metrics: the GenAI metrics go over OTLP only (exporter = otlp)")

    # ------------------------------------------------------------ per request

    def begin(self, ctx: RequestContext, incoming: tuple[bytes, bytes | None] | None) -> None:
        """Fix the trace ids of a request (continuing a trusted incoming ``traceparent``)."""
        if incoming is None or not self._trust:  # the common case: a new trace, no parent
            trace_id = _getrandbits(128) or 1
            ctx.trace = TraceContext(
                trace_id,
                _getrandbits(64) or _span_id(),
                None,
                (trace_id & _TRACE_ID_LIMIT) < self._bound and self.enabled,
                "",
            )
            return
        parent = parse_traceparent(incoming[0])
        if parent is not None:
            trace_id, parent_id, parent_sampled = parent
            # ParentBased: follow the remote parent's decision (else decide on the trace id)
            sampled = parent_sampled if self._parent_based else self.sample(trace_id)
            state = incoming[1].decode("latin-1") if incoming[1] else ""
        else:
            trace_id = _getrandbits(128) or 1
            parent_id = None
            sampled = self.sample(trace_id)
            state = ""
        ctx.trace = TraceContext(trace_id, _span_id(), parent_id, sampled and self.enabled, state)

    def adopt(self, ctx: RequestContext, traceparent: Any, tracestate: Any) -> bool:
        """Make a W3C ``traceparent`` carried inside the request (an MCP message's
        ``params._meta``, docs/spec.md §23) the root's parent, as a header's would be: the same
        trust and the same ParentBased sampling. The request's own context (an incoming
        header's parent) is kept as a span link. False (nothing changes) when tracing is off,
        incoming contexts are not trusted, or the value is no valid traceparent."""
        old = ctx.trace
        if old is None or not self.enabled or not self._trust or not isinstance(traceparent, str):
            return False
        if len(traceparent) > 128 or not traceparent.isascii():
            return False
        parent = parse_traceparent(traceparent.encode())
        if parent is None:
            return False
        trace_id, parent_id, parent_sampled = parent
        state = tracestate if _valid_state(tracestate) else ""
        sampled = parent_sampled if self._parent_based else self.sample(trace_id)
        trace = TraceContext(trace_id, old.root_span_id, parent_id, sampled, state)
        if old.parent_span_id is not None and (old.trace_id, old.parent_span_id) != (
            trace_id,
            parent_id,
        ):
            trace.link = (old.trace_id, old.parent_span_id, old.trace_state)
        ctx.trace = trace
        return True

    def sample(self, trace_id: int) -> bool:
        """The root decision of TraceIdRatioBased: the low 64 bits against the SDK's bound."""
        return (trace_id & _TRACE_ID_LIMIT) < self._bound

    def attempt_headers(self, ctx: RequestContext, attempt: Attempt) -> list[tuple[str, str]]:
        trace = ctx.trace
        assert trace is not None  # begin() ran: every traced request has its ids
        # TraceContext.traceparent inlined: the trace id's hex is formatted once per request
        traceparent = trace.prefix + attempt.span_id.to_bytes(8, "big").hex() + trace.suffix
        if trace.trace_state:
            return [("traceparent", traceparent), ("tracestate", trace.trace_state)]
        return [("traceparent", traceparent)]

    @staticmethod
    def auto_instrumented() -> bool:
        """Whether an OpenTelemetry SDK is installed globally (``opentelemetry-instrument``):
        then instrumented libraries (aiohttp's client, ...) make spans of their own."""
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)

    @contextlib.contextmanager
    def attempt_current(self, ctx: RequestContext, attempt: Attempt) -> Iterator[None]:
        """The attempt's CLIENT span as the current OpenTelemetry span while its client library
        runs, so auto-instrumented spans nest under the gateway's trace (docs/spec.md §7)."""
        from opentelemetry import context, trace

        ids = ctx.trace
        assert ids is not None
        span = trace.NonRecordingSpan(
            trace.SpanContext(
                ids.trace_id,
                attempt.span_id,
                is_remote=False,
                trace_flags=trace.TraceFlags(0x01 if ids.sampled else 0x00),
                trace_state=trace.TraceState.from_header([ids.trace_state])
                if ids.trace_state
                else None,
            )
        )
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)

    def new_span_id(self) -> int:
        return _span_id()

    def traceresponse(self, ctx: RequestContext) -> tuple[bytes, bytes] | None:
        trace = ctx.trace
        if trace is None or not self.enabled:
            return None
        return (b"traceresponse", trace.traceparent(trace.root_span_id).encode())

    def keep(self, ctx: RequestContext) -> int:
        """The decision as the request ends (docs/spec.md §7): sampled up front, or kept by a
        ``keep`` rule now that the outcome is known. A request a rule keeps is marked sampled,
        so the access log, exemplars and the live view follow the same decision: DROPPED,
        SAMPLED (by the ratio or the parent) or KEPT (by a rule)."""
        trace = ctx.trace
        if trace is None or not self.enabled:
            return DROPPED
        if trace.sampled:
            return SAMPLED
        if self._keep.any and self._keep.matches(ctx):
            trace.sampled = True
            self.kept += 1
            return KEPT
        return DROPPED

    def finish(self, ctx: RequestContext, edge_hops: list[EdgeHop]) -> None:
        """Build and queue the spans of a request :meth:`keep` kept (nothing otherwise)."""
        trace = ctx.trace
        queue = self.queue
        if trace is None or not trace.sampled or queue is None:
            return
        if isinstance(queue, ProcessExport):  # the common request: only recorded here
            rec = record(
                ctx,
                trace,
                edge_hops,
                self.edge_hop_count,
                self.cache_backend,
                self.auth_mode,
                self.style,
            )
            if rec is not None:
                queue.put_record(rec, record_spans(rec))
                return
        block, count = build_framed(
            ctx,
            trace,
            edge_hops,
            self.edge_hop_count,
            self.cache_backend,
            self.auth_mode,
            self.style,
        )
        queue.put_framed(block, count)

    def state(self) -> dict[str, Any]:
        if self.queue is None:
            return {"exporter": "none"}
        q = self.queue
        return {
            "exporter": self.cfg.exporter,
            "endpoint": q.exporter.endpoint,
            "state": q.state(),
            "exported": q.exported,
            "failed": q.failed,
            "dropped": q.dropped,
            "kept": self.kept,
            **(
                {
                    "export_in": "process",
                    "exporter_pid": q.process.pid if q.process is not None else None,
                    "restarts": q.restarts,
                }
                if isinstance(q, ProcessExport)
                else {}
            ),
        }

    def shutdown(self) -> None:
        if self.queue is not None:
            self.queue.shutdown(self.cfg.shutdown_timeout_s)
        if self.genai_metrics is not None:
            self.genai_metrics.shutdown(self.cfg.shutdown_timeout_s)
