"""One A2A call sent to its agent and the answer relayed to the client (docs/spec.md §30).

The call opens its :class:`~gateway.context.Attempt` as every upstream call does
(:func:`gateway.attempts.open_attempt`; A2A calls are not retried: a message is not
idempotent), and the CLIENT span's id goes to the agent as ``traceparent``.

**A JSON answer** is read whole (at most ``max_message_bytes``), parsed, its ids bound to the
caller's tenant (:mod:`gateway.a2a.binding`) and relayed as the gateway parsed it (one reading:
a member written twice cannot show the client something else than what was checked); an
answer of status 200 that is no JSON is a 502 ``a2a_bad_answer``. The whole exchange is
bounded by the agent's ``timeout_s`` (504 ``a2a_timeout``).

**An SSE answer** (``SendStreamingMessage``, ``SubscribeToTask`` and their REST and 0.3 twins)
is relayed event by event as each one completes, each event parsed and its ids bound before it
goes out. The stream is complete when an event reports a final or interrupted state
(completed, failed, canceled, rejected, input-required, auth-required), a message, or an
error; the gateway ends the client's stream there. A stream that ends before that — the agent
closed it, a read waited past ``timeout_s``, an event passed ``max_message_bytes`` or was no
JSON — is never passed off as complete: it ends with an error event of its binding (JSON-RPC
``-32603``; HTTP+JSON ``event: error``), and the call is counted ``cut`` (``timeout``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from gateway.a2a.agents import Agent, read_capped
from gateway.a2a.binding import Binder
from gateway.a2a.protocol import INTERNAL_ERROR, Facts, Method, facts_of, rest_error, rpc_error
from gateway.attempts import open_attempt, send_once
from gateway.context import Attempt, RequestContext
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.headers import header_value
from gateway.streaming.bodies import upstream_finished
from gateway.streaming.relay import until_disconnect
from gateway.streaming.sse import SSEParser, event_data, event_name
from gateway.transports import UpstreamResponse
from gateway.types import RawHeaders, Receive
from gateway.writer import ResponseWriter

SSE = b"text/event-stream"
#: the agent's headers that reach the client
_KEEP = (b"content-type", b"cache-control", b"a2a-version", b"a2a-extensions")


class AgentCall:
    """One A2A call through the gateway: what the request is and where its facts go."""

    __slots__ = ("agent", "binder", "ctx", "facts", "method", "out", "receive", "rest", "rid")

    def __init__(
        self,
        ctx: RequestContext,
        out: ResponseWriter,
        receive: Receive,
        agent: Agent,
        binder: Binder,
    ) -> None:
        self.ctx, self.out, self.receive = ctx, out, receive
        self.agent = agent
        self.binder = binder
        #: ctx.a2a: the call's facts for its span, metrics, log line and live-view row
        self.facts: dict[str, Any] = ctx.a2a if ctx.a2a is not None else {}
        self.method: Method | None = None
        #: the JSON-RPC request's id (None: the HTTP+JSON binding)
        self.rid: Any = None
        self.rest = False

    def note(self, facts: Facts) -> None:
        """The first task and context an answer names, and the last state it reports."""
        f = self.facts
        if facts.tasks and f.get("task") is None:
            f["task"] = facts.tasks[0]
        if facts.contexts and f.get("context") is None:
            f["context"] = facts.contexts[0]
        if facts.state is not None:
            f["state"] = facts.state

    def failed(self, status: str, code: str) -> None:
        self.facts["status"], self.facts["error"] = status, code


async def relay(
    call: AgentCall, http: str, url: str, headers: list[tuple[str, str]], body: bytes | None
) -> None:
    """Send the call to ``url`` and relay its answer (the module docstring)."""
    ctx, agent = call.ctx, call.agent
    attempt = open_attempt(ctx, agent.backend, len(ctx.attempts) + 1, call.facts["span_id"])
    method = call.method
    assert method is not None

    async def exchange() -> None:
        resp = await send_once(ctx, attempt, agent.transport, (http, url, headers, body))
        if (header_value(resp.headers, b"content-type") or b"").startswith(SSE):
            await _Stream(call, attempt).relay(resp)
        else:
            await _whole(call, attempt, resp)

    await until_disconnect(ctx, call.receive, _bounded(call, exchange(), method.streams))


async def _bounded(call: AgentCall, work: Any, streams: bool) -> None:
    """A JSON answer within ``timeout_s`` (504); a stream's reads are bounded one by one."""
    timeout = call.agent.config.timeout_s
    try:
        async with asyncio.timeout(None if streams else timeout):
            await work
    except TimeoutError as exc:
        call.failed("timeout", "a2a_timeout")
        raise UpstreamTimeout(
            f"the agent {call.agent.name!r} did not answer within {timeout:g} s",
            code="a2a_timeout",
        ) from exc


def _client_headers(resp: UpstreamResponse) -> RawHeaders:
    out = [(k, v) for k, v in resp.headers if k in _KEEP]
    if (header_value(resp.headers, b"content-type") or b"").startswith(SSE):
        out.append((b"x-accel-buffering", b"no"))
    return out


async def _whole(call: AgentCall, attempt: Attempt, resp: UpstreamResponse) -> None:
    ctx, agent = call.ctx, call.agent
    what = f"the answer of agent {agent.name!r}"
    try:
        body = await read_capped(resp, agent.config.max_message_bytes, what)
    finally:
        upstream_finished(ctx, attempt, resp)
    headers = _client_headers(resp)
    if resp.status >= 300:
        call.failed("upstream_error", str(resp.status))
        _note_error(call, body)
        await call.out.whole(resp.status, headers, body)
        return
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict):
        raise UpstreamError(f"{what} is no JSON object", code="a2a_bad_answer")
    if call.rest or "error" not in obj:
        await _checked(call, obj.get("result") if not call.rest else obj)
    else:
        _note_error(call, body)
    await call.out.whole(resp.status, headers, orjson.dumps(obj))


async def _checked(call: AgentCall, result: Any) -> None:
    """Bind (or, for a list, filter) the ids a result names."""
    method = call.method
    assert method is not None
    facts = facts_of(result, method)
    if method.kind == "list" and isinstance(result, dict):
        tasks = result.get("tasks")
        if isinstance(tasks, list) and call.binder.tenant is not None:
            kept = [t for t in tasks if await call.binder.mine(t)]
            result["tasks"] = kept
            result["totalSize"] = len(kept)
        return
    await call.binder.bind(facts)
    call.note(facts)


def _note_error(call: AgentCall, body: bytes) -> None:
    """The error an answer carries (JSON-RPC ``error.code``; REST ``error.status``)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    error = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(error, dict):
        call.failed("error", str(error.get("code") if not call.rest else error.get("status")))


class _Stream:
    """One SSE answer relayed event by event until its final event."""

    __slots__ = ("attempt", "call", "final")

    def __init__(self, call: AgentCall, attempt: Attempt) -> None:
        self.call, self.attempt = call, attempt
        self.final = False

    async def relay(self, resp: UpstreamResponse) -> None:
        call = self.call
        out, cap = call.out, call.agent.config.max_message_bytes
        await out.start(resp.status, _client_headers(resp))
        parser = SSEParser()
        try:
            async for chunk in resp.aiter_raw():
                await self._events(parser.feed(chunk))
                if self.final:
                    break
                if len(parser.pending) > cap:
                    raise UpstreamError(
                        f"an event of agent {call.agent.name!r} passed {cap} bytes",
                        code="a2a_message_too_large",
                    )
            if not self.final:
                await self._events(parser.finish())
            if not self.final:
                raise UpstreamError(
                    f"the agent {call.agent.name!r} ended its stream before the task reached a "
                    "final or interrupted state",
                    code="a2a_stream_truncated",
                )
        except (UpstreamError, UpstreamTimeout) as exc:
            await self._cut(exc)
            return
        finally:
            upstream_finished(call.ctx, self.attempt, resp)
            await resp.aclose()
        await out.body(b"")

    async def _events(self, events: list[bytes]) -> None:
        for event in events:
            if self.final:
                return
            relayed = await self._event(event)
            if relayed:
                await self.call.out.body(relayed, more=True)

    async def _event(self, event: bytes) -> bytes:
        """The event as it goes to the client (its ids bound first); b"": not relayed."""
        call = self.call
        data = event_data(event)
        if data is None:
            return event  # a comment (a keep-alive): passed on
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            raise UpstreamError(
                f"agent {call.agent.name!r} sent a stream event that is no JSON object",
                code="a2a_bad_answer",
            )
        name = event_name(event)
        if (call.rest and name == b"error") or (not call.rest and "error" in obj):
            self.final = True
            _note_error(call, data)
        else:
            method = call.method
            assert method is not None
            facts = facts_of(obj if call.rest else obj.get("result"), method)
            await call.binder.bind(facts)
            call.note(facts)
            self.final = facts.final
            if call.ctx.timeline.first_content is None:
                call.ctx.timeline.first_content = time.perf_counter()
        head = b"event: " + name + b"\n" if name is not None else b""
        return head + b"data: " + orjson.dumps(obj) + b"\n\n"

    async def _cut(self, exc: UpstreamError | UpstreamTimeout) -> None:
        """The stream ends with its binding's error event: never passed off as complete."""
        call = self.call
        timed_out = isinstance(exc, UpstreamTimeout)
        code = "a2a_timeout" if timed_out else exc.code or "a2a_stream_truncated"
        call.failed("timeout" if timed_out else "cut", code)
        call.ctx.answer.error = exc
        if call.out.finished:
            return
        if call.rest:
            event = b"event: error\ndata: " + rest_error(INTERNAL_ERROR, exc.message)[1]
        else:
            event = b"data: " + rpc_error(call.rid, INTERNAL_ERROR, exc.message)
        await call.out.body(event + b"\n\n")


__all__ = ["SSE", "AgentCall", "relay"]
