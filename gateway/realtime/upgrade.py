"""Where the app hands a WebSocket scope (docs/spec.md §19): ``GET /v1/realtime`` to the
runtime's realtime sessions, any other handshake refused as HTTP before any upgrade."""

from __future__ import annotations

from gateway.config import RealtimeConfig
from gateway.errors import error_body
from gateway.realtime.session import Realtime, http_send
from gateway.realtime.spans import ROUTE
from gateway.runtime import Runtime
from gateway.types import Receive, Scope, Send


class RealtimeEndpoint:
    """The app's WebSocket endpoint: one :class:`~gateway.realtime.session.Realtime` per
    runtime, made by the first session; a handshake it does not take is refused
    (:func:`refuse_upgrade`)."""

    __slots__ = ("_enabled", "_sessions")

    def __init__(self, config: RealtimeConfig) -> None:
        self._enabled = config.enabled
        self._sessions: Realtime | None = None

    async def __call__(
        self, rt: Runtime | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if rt is None or scope["path"] != ROUTE or not self._enabled:
            await refuse_upgrade(scope, receive, send, rt is not None, self._enabled)
            return
        sessions = self._sessions
        if sessions is None or sessions.rt is not rt:
            sessions = self._sessions = Realtime(rt)
        await sessions(scope, receive, send)


async def refuse_upgrade(
    scope: Scope, receive: Receive, send: Send, started: bool, enabled: bool
) -> None:
    """Answer a WebSocket handshake the gateway does not take, as HTTP before any upgrade:
    503 while starting, 404 with ``[realtime] enabled = false``, 426 on any path but
    ``/v1/realtime`` (the Codex CLI tries one on ``/v1/responses`` first, then falls back to
    HTTP as it does against OpenAI)."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if not started:
        status, kind, code = 503, "service_unavailable", "starting"
        text = "the gateway is starting"
    elif scope["path"] != ROUTE:
        status, kind, code = 426, "invalid_request_error", "upgrade_not_supported"
        text = f"WebSocket is served on {ROUTE} only; use HTTP here"
    else:
        status, kind, code = 404, "not_found_error", "realtime_disabled"
        text = "realtime sessions are off on this gateway ([realtime] enabled = false)"
    body = error_body(text, kind, code)
    out = http_send(scope, send)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    try:
        await out({"type": "http.response.start", "status": status, "headers": headers})
        await out({"type": "http.response.body", "body": body})
    except OSError:
        return


__all__ = ["RealtimeEndpoint", "refuse_upgrade"]
