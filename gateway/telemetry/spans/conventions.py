"""Which names a model call's spans carry (``[tracing] conventions``, docs/spec.md §7).

``genai`` (the default): the OpenTelemetry GenAI conventions, written by the builders and the
framed fast path alike. ``openinference``: the same spans and attributes, plus OpenInference's
(Arize Phoenix reads those): ``openinference.span.kind`` on the root (``CHAIN``, ``TOOL`` for an
MCP tool call) and on each CLIENT span (``LLM``, ``EMBEDDING``, ``TOOL``), ``llm.model_name``,
``llm.provider`` / ``llm.system``, ``llm.token_count.*`` (prompt, completion, total and their
cache and reasoning details), ``llm.cost.total`` and ``session.id``; captured content as
``llm.input_messages.{i}.message.*``, ``input.value`` and ``output.value``
(:mod:`gateway.telemetry.content`). The contract's names stay on the spans in either mode, so
dashboards and span queries written for one keep working with the other.
"""

from __future__ import annotations

from typing import Any

from gateway.budgets.spend import cost
from gateway.context import Attempt, RequestContext
from gateway.telemetry import otlp
from gateway.telemetry.content import ContentPolicy

_s = otlp.stable_attr
_a = otlp.attr
_i = otlp.int_attr
_f = otlp.float_attr
_str = otlp.str_attr


class SpanStyle:
    """How spans are written beyond the timings: the naming conventions and the content
    policy (built once from ``[tracing]``)."""

    __slots__ = ("content", "openinference")

    def __init__(self, content: ContentPolicy | None = None, openinference: bool = False) -> None:
        self.content = content or ContentPolicy()
        self.openinference = openinference


#: the default: GenAI names, no content
GENAI = SpanStyle()


def llm_attrs(ctx: RequestContext, attempt: Attempt, last: bool) -> list[bytes]:
    """OpenInference's attributes of one CLIENT span of a model call; the answering (last)
    attempt also carries the usage and the cost."""
    call = ctx.call
    embedding = call is not None and call.operation == "embeddings"
    attrs = [_s("openinference.span.kind", "EMBEDDING" if embedding else "LLM")]
    answer = ctx.answer
    model = (answer.response_model if last else None) or ctx.model
    if model:
        attrs.append(_str("embedding.model_name" if embedding else "llm.model_name", model))
    provider = attempt.backend.provider
    attrs.append(_s("llm.provider", provider))
    attrs.append(_s("llm.system", provider))
    if ctx.conversation_id is not None:
        attrs.append(_str("session.id", ctx.conversation_id))
    if last:
        attrs.extend(_token_counts(ctx))
    return attrs


def _token_counts(ctx: RequestContext) -> list[bytes]:
    usage = ctx.answer.tokens
    attrs: list[bytes] = []
    if usage.input is not None:
        attrs.append(_i("llm.token_count.prompt", usage.input))
    if usage.output is not None:
        attrs.append(_i("llm.token_count.completion", usage.output))
    if usage.reported:
        attrs.append(_i("llm.token_count.total", usage.total))
    if usage.cached_input:
        attrs.append(_i("llm.token_count.prompt_details.cache_read", usage.cached_input))
    if usage.cache_write:
        attrs.append(_i("llm.token_count.prompt_details.cache_write", usage.cache_write))
    if usage.reasoning:
        attrs.append(_i("llm.token_count.completion_details.reasoning", usage.reasoning))
    usd = cost(ctx)
    if usd is not None:
        attrs.append(_f("llm.cost.total", usd))
    return attrs


def root_attrs(ctx: RequestContext) -> list[bytes]:
    """The root's OpenInference kind: the request is the chain its model call (or tool
    call) runs in."""
    mcp = ctx.mcp
    tool = mcp.get("tool") if mcp is not None else None
    attrs = [_s("openinference.span.kind", "TOOL" if tool else "CHAIN")]
    if tool:
        attrs.append(_s("tool.name", str(tool)))
    if ctx.conversation_id is not None:
        attrs.append(_str("session.id", ctx.conversation_id))
    return attrs


def tool_attrs(mcp: dict[str, Any], own: bool) -> list[bytes]:
    """An MCP CLIENT span's OpenInference kind: ``TOOL`` for the tool call itself."""
    tool = None if own else mcp.get("tool")
    if not tool:
        return [_s("openinference.span.kind", "CHAIN")]
    return [_s("openinference.span.kind", "TOOL"), _s("tool.name", str(tool))]


def content_attrs(ctx: RequestContext, policy: ContentPolicy) -> list[bytes]:
    """The captured content as span attributes (only when ``capture_content`` is on)."""
    values, truncated = policy.attributes(ctx)
    attrs = [_a(name, value) for name, value in values.items()]
    if truncated:
        attrs.append(_s("gateway.content.truncated", True))
    return attrs


__all__ = ["GENAI", "SpanStyle", "content_attrs", "llm_attrs", "root_attrs", "tool_attrs"]
