"""The JSON access log: one line per request, from the Timeline (docs/spec.md §11); and the
format of every other line the process writes (``[logging] format``, docs/spec.md §4).

Sampled as ``[logging]`` says: ``all``; ``sampled`` = every non-2xx, every request slower than
``slow_ms``, every request a tracing ``keep`` rule kept, and ``sample_ratio`` of the rest (drawn
on the trace id like the tracer's ratio, so the lines and the traces kept are the same requests,
docs/spec.md §7); ``off``. Nothing is formatted for a request that
is sampled out. Never a key, a prompt or a completion: only what is listed in :func:`line`.

With ``format = "json"`` (the default) every line is one JSON object — warnings, the server's
own lines and the startup lines too — so a log shipper (Loki, Vector, CloudWatch) parses all of it;
``format = "text"`` is for humans at a terminal.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from typing import Any

import orjson

from gateway.budgets.spend import cost
from gateway.config import LoggingConfig
from gateway.context import RequestContext, Usage

ACCESS_LOGGER = "gateway.access"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``msg`` (and ``exc``)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return orjson.dumps(out).decode()


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_config(cfg: LoggingConfig) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` of a serving process (``gateway serve`` and each worker
    apply it: :func:`gateway.server.process.configure_logging`): the gateway's loggers,
    uvicorn's (its WebSocket protocol logs there) and the root one write to stderr in
    ``cfg.format``. The
    access log keeps its own stdout handler (:class:`AccessLog`; its lines are JSON objects
    already)."""
    level = cfg.level.upper()
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonFormatter"} if cfg.format == "json" else {"format": TEXT_FORMAT}
    )
    quiet = {"handlers": ["stderr"], "level": level, "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"line": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "line",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "gateway": quiet,
            "uvicorn": quiet,
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["stderr"], "level": level, "propagate": False},
        },
        "root": {"handlers": ["stderr"], "level": "WARNING"},
    }


def configure(cfg: LoggingConfig) -> None:
    """Apply :func:`log_config` in this process (before anything is logged), warnings too."""
    import logging.config

    logging.config.dictConfig(log_config(cfg))
    logging.captureWarnings(True)  # py.warnings -> the root logger -> the same format


class AccessLog:
    """Writes :func:`line` as JSON to the ``gateway.access`` logger (stdout by default).

    While that logger has only the stdout handler this class gave it (no filter, nothing else
    attached: the default), a line is written to the handler's stream directly -- the same
    bytes a ``logger.info`` would write, without a LogRecord, the caller lookup and the locks.
    Anything attached to the logger (a test's handler, a filter) turns that off."""

    def __init__(self, cfg: LoggingConfig) -> None:
        self.mode = cfg.access_log
        self.slow_s = cfg.slow_ms / 1000
        self.ratio = cfg.sample_ratio
        #: the ratio as a bound on a trace id's low 64 bits, as the tracer's TraceIdRatioBased
        #: draws: a traced request is logged at the same draw (docs/spec.md §7, §11)
        self._bound = round(cfg.sample_ratio * (1 << 64))
        self.logger = logging.getLogger(ACCESS_LOGGER)
        #: the stdout handler this process's first AccessLog attached (None: somebody else's)
        self._own: logging.StreamHandler[Any] | None = _OWN.get(ACCESS_LOGGER)
        if not self.logger.handlers:
            handler = logging.StreamHandler(sys.stdout)
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.logger.addHandler(handler)
            self.logger.propagate = False
            self._own = _OWN[ACCESS_LOGGER] = handler
        self.logger.setLevel(logging.INFO)

    def _direct(self) -> logging.StreamHandler[Any] | None:
        """The handler to write to directly, when nothing but it would see a record."""
        own = self._own
        logger = self.logger
        if (
            own is None
            or logger.handlers != [own]
            or logger.filters
            or own.filters
            or logger.disabled
            or not logger.isEnabledFor(logging.INFO)
            or own.level > logging.INFO
        ):
            return None
        return own

    def wants(self, ctx: RequestContext, kept: bool = False) -> bool:
        """``kept``: a tracing ``keep`` rule kept the request's trace, so its line is kept too.
        The ratio's draw is made on the trace id when there is one (the tracer's draw): at
        ratios no larger than the tracer's, every line so drawn has its trace."""
        if self.mode == "all":
            return True
        if self.mode == "off":
            return False
        if kept or not 200 <= ctx.answer.status < 300 or ctx.request_time() >= self.slow_s:
            return True
        trace = ctx.trace
        if trace is not None:
            return (trace.trace_id & _LOW_64) < self._bound
        return random.random() < self.ratio

    def record(self, ctx: RequestContext, kept: bool = False) -> None:
        if self.wants(ctx, kept):
            text = orjson.dumps(line(ctx)).decode()
            own = self._direct()
            if own is None:
                self.logger.info(text)
                return
            try:  # StreamHandler.emit, minus the record and the formatting
                own.stream.write(text + own.terminator)
                own.flush()
            except Exception:  # as logging does: a broken stdout never fails a request
                own.handleError(logging.makeLogRecord({"msg": text, "name": ACCESS_LOGGER}))


_LOW_64 = (1 << 64) - 1
#: logger name -> the handler an AccessLog attached to it (there is one such logger per process)
_OWN: dict[str, logging.StreamHandler[Any]] = {}


def _tokens(usage: Usage) -> dict[str, int | None]:
    out: dict[str, int | None] = {"input": usage.input, "output": usage.output}
    if usage.cached_input:
        out["cached_input"] = usage.cached_input
    if usage.cache_write:
        out["cache_write"] = usage.cache_write
    if usage.reasoning:
        out["reasoning"] = usage.reasoning
    return out


def line(ctx: RequestContext) -> dict[str, Any]:
    trace = ctx.trace
    answer = ctx.answer
    call = ctx.call
    request_s = ctx.request_time()
    upstream_s = ctx.upstream_time(ctx.timeline.done)
    backoff_s = ctx.timeline.backoff
    ttft = ctx.ttft()
    last = ctx.attempts[-1] if ctx.attempts else None
    out: dict[str, Any] = {
        "ts": round(time.time(), 3),
        "trace_id": trace.id_bytes.hex() if trace is not None else None,
        "span_id": trace.root_span_id.to_bytes(8, "big").hex() if trace is not None else None,
        "request_id": ctx.request_id,
        "method": ctx.method,
        "path": ctx.path,
        "status": answer.status,
        "model": ctx.model,
        "route": call.route.name if call is not None else None,
        "backend": last.backend.name if last is not None else None,
        "attempts": len(ctx.attempts),
        "tenant": ctx.tenant,
        "cache": ctx.cache.result,
        "stream": call.stream if call is not None else False,
        "client": ctx.client_address,
        "request_time_ms": round(request_s * 1000, 3),
        "upstream_time_ms": round(upstream_s * 1000, 3),
        "overhead_ms": round(max(0.0, request_s - upstream_s - backoff_s) * 1000, 3),
        "ttft_ms": round(ttft * 1000, 3) if ttft is not None else None,
        "backoff_ms": round(backoff_s * 1000, 3),
        "tokens": _tokens(answer.tokens),
        "cost_usd": cost(ctx),  # docs/spec.md §20 (null: not a model call, or no price)
    }
    kind = answer.error_type()
    if kind is not None:
        out["error_type"] = kind
    if ctx.mcp is not None:  # an MCP request (docs/spec.md §23): server, method, tool, status
        out["mcp"] = {k: v for k, v in ctx.mcp.items() if k != "methods"}
    if ctx.a2a is not None:  # an A2A call (docs/spec.md §30): agent, method, task, status
        out["a2a"] = {k: v for k, v in ctx.a2a.items() if k != "span_id"}
    return out
