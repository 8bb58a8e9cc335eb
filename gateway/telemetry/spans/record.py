"""The common request's spans as one compact record (docs/spec.md §7, ``export_in = "process"``).

With the exporter in a process of its own, the serving process does not build the common
request's span tree: :func:`record` reads what the tree is made of — the Timeline's stamps, the
ids, the labels, the usage and cost, the one attempt — into one flat tuple of numbers and
strings (``marshal``-able), and the exporter process turns it into the very bytes
:func:`~gateway.telemetry.spans.framed.build_framed` writes (:func:`build_record`: the same code,
over a stand-in of the request read back from the record). Any other request (edge hops, an
error, a retry, MCP, captured content, OpenInference names, …: see
:func:`~gateway.telemetry.spans.framed.is_common`) keeps its spans built in the serving process.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway.budgets.spend import cost
from gateway.context import RequestContext, TraceContext
from gateway.telemetry.spans.conventions import GENAI, SpanStyle
from gateway.telemetry.spans.framed import common_tree, is_common
from gateway.telemetry.spans.tree import EdgeHop, _request_values

#: the record layout's version (the first field): a record of another layout is not built
VERSION = 1
Record = tuple[Any, ...]


def record(
    ctx: RequestContext,
    trace: TraceContext,
    edge_hops: list[EdgeHop],
    hop_base: int,
    cache_backend: str,
    auth_mode: str,
    style: SpanStyle = GENAI,
) -> Record | None:
    """The common request's record; None for any other (its spans are built here)."""
    if not is_common(ctx, trace, edge_hops, style):
        return None
    t = ctx.timeline
    call = ctx.call
    assert call is not None
    answer = ctx.answer
    usage = answer.tokens
    c = ctx.cache
    attempt: tuple[Any, ...] | None = None
    if ctx.attempts:
        a = ctx.attempts[0]
        b = a.backend
        attempt = (
            a.start,
            a.end,
            a.span_id,
            a.number,
            a.status,
            b.provider,
            b.host,
            b.port,
            b.name,
        )
    reasons = answer.finish_reasons
    scope = ctx.scope
    return (
        VERSION, hop_base, cache_backend, auth_mode, trace.trace_id, trace.root_span_id,
        t.received, t.wall_ns, t.done, t.auth_done, t.intake_done, t.routed, t.body_received,
        t.first_content, t.loop_lag,
        len(call.body), call.route.name, call.operation, call.stream,
        *_request_values(call.payload),
        c.result, c.lookup_start, c.lookup_end, c.store_start, c.store_end, c.stored, c.error,
        answer.status, answer.response_id, answer.response_model,
        tuple(reasons) if reasons else None,
        usage.input, usage.output, usage.cached_input, usage.cache_write, usage.reasoning,
        cost(ctx), ctx.conversation_id,
        ctx.model, ctx.method, ctx.path, scope.get("scheme", "http"),
        scope.get("http_version", "1.1"), ctx.client_address, ctx.tenant, ctx.request_id,
        attempt,
    )  # fmt: skip


def record_spans(rec: Record) -> int:
    """How many spans a record makes: three hops and the root, the cache's, the attempt's."""
    return 4 + (rec[_LOOKUP] is not None) + (rec[_STORE] is not None) + (rec[-1] is not None)


#: where the cache lookup's and the cache store's starts are in a record
_LOOKUP, _STORE = 22, 24


class _Sized:
    """Stands for the request body: the tree reads only its length."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def build_record(rec: Record) -> tuple[bytes, int]:
    """The framed spans of a :func:`record` and their count (in the exporter process)."""
    (
        version, hop_base, cache_backend, auth_mode, trace_id, root_span_id,
        received, wall_ns, done, auth_done, intake_done, routed, body_received,
        first_content, loop_lag,
        body_len, route, operation, stream, max_tokens, temperature,
        result, lookup_start, lookup_end, store_start, store_end, stored, cache_error,
        status, response_id, response_model, reasons,
        t_in, t_out, t_cached, t_written, t_reasoning, usd, conversation,
        model, method, path, scheme, http_version, client, tenant, request_id,
        attempt,
    ) = rec  # fmt: skip
    if version != VERSION:
        raise ValueError(f"span record of layout {version}, not {VERSION}")
    attempts = []
    if attempt is not None:
        start, end, span_id, number, a_status, provider, host, port, name = attempt
        backend = SimpleNamespace(provider=provider, host=host, port=port, name=name)
        attempts.append(
            SimpleNamespace(
                start=start, end=end, span_id=span_id, number=number, status=a_status,
                backend=backend,
            )
        )  # fmt: skip
    payload: dict[str, Any] = {}
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    if temperature is not None:
        payload["temperature"] = temperature
    ctx = SimpleNamespace(
        timeline=SimpleNamespace(
            received=received, wall_ns=wall_ns, done=done, auth_done=auth_done,
            intake_done=intake_done, routed=routed, body_received=body_received,
            first_content=first_content, loop_lag=loop_lag,
        ),
        attempts=attempts,
        call=SimpleNamespace(
            body=_Sized(body_len), route=SimpleNamespace(name=route), operation=operation,
            stream=stream, payload=payload,
        ),
        cache=SimpleNamespace(
            result=result, lookup_start=lookup_start, lookup_end=lookup_end,
            store_start=store_start, store_end=store_end, stored=stored, error=cache_error,
        ),
        answer=SimpleNamespace(
            status=status, response_id=response_id, response_model=response_model,
            finish_reasons=list(reasons) if reasons else None, costed=True, cost_usd=usd,
            tokens=SimpleNamespace(
                input=t_in, output=t_out, cached_input=t_cached, cache_write=t_written,
                reasoning=t_reasoning,
            ),
        ),
        conversation_id=conversation, model=model, method=method, path=path,
        scope={"scheme": scheme, "http_version": http_version}, client_address=client,
        tenant=tenant, request_id=request_id,
    )  # fmt: skip
    trace = TraceContext(trace_id, root_span_id, None, True, "")
    return common_tree(ctx, trace, hop_base, cache_backend, auth_mode)  # type: ignore[arg-type]
