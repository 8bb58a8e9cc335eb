"""The built-in live view (SPEC §18): recent requests and their hop waterfall, in the browser.

Endpoints under ``[ui] path`` (``/_gateway/``), all answered here, outside any request scope:

=======================  ============================================================
``GET {path}``           the page (``gateway/ui/index.html`` + ``live.js`` + ``live.css``)
``GET {path}api/requests``  the ring buffer's records as JSON, newest first, with stats
``GET {path}api/stream``    the live feed: one SSE event per finished request
``GET {path}api/backends``  backends with their health, and what ``/readyz`` reports
``POST|DELETE {path}api/session``  sign in (sets the view's cookie) / sign out
=======================  ============================================================

The view's own requests are not recorded, traced or access-logged (they never enter a
:class:`~gateway.scope.RequestScope`), and neither are ``/healthz``, ``/readyz`` and
``/metrics``: the buffer holds the traffic the gateway serves, not the traffic of its watchers.

Auth (``auth.mode = "keys"``): the API needs a key whose ``[[auth.keys]]`` entry has
``admin = true``, sent as ``Authorization: Bearer`` / ``api-key`` / ``x-api-key`` (scripts), or —
browsers cannot put a header on an ``EventSource`` — the HttpOnly, ``SameSite=Strict`` cookie
that ``POST {path}api/session`` sets after checking the key the page's sign-in form sends. Keys
are never accepted in the URL (URLs end up in browser history, proxy logs and ``Referer``) and
never logged. No key: 401; a key that is not admin: 403 (the OpenAI error shape). The page and
its two static files carry no data and are served to anyone who reaches the port.

Live feed: the stream first sends what the buffer holds after ``Last-Event-ID`` (or
``?after=SEQ``), then each new request; each watcher has a bounded queue and is dropped when it
falls behind. A stream ends after :data:`STREAM_MAX_S` and the browser's ``EventSource``
reconnects with ``Last-Event-ID``, so nothing is lost — and an open page never holds a
graceful shutdown for longer than that (uvicorn waits for open responses before it stops).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

import orjson

from gateway.config import Config
from gateway.errors import Forbidden, GatewayError, InvalidRequest, NotFound, Unauthorized
from gateway.live.recent import RecentRequests, percentiles, stats
from gateway.routes import Backend
from gateway.runtime import Endpoint, Runtime
from gateway.types import RawHeaders, Receive, Scope, Send

COOKIE = "gateway_ui_key"
#: a live-feed response ends after this long; EventSource reconnects (Last-Event-ID)
STREAM_MAX_S = 5.0
#: the browser's reconnect delay (ms), sent as the stream's ``retry:``
STREAM_RETRY_MS = 500
_ASSETS = {
    "": ("index.html", b"text/html; charset=utf-8"),
    "live.js": ("live.js", b"text/javascript; charset=utf-8"),
    "live.css": ("live.css", b"text/css; charset=utf-8"),
}
_CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    b"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_COMMON: RawHeaders = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
_JSON = (b"content-type", b"application/json")
_NO_STORE = (b"cache-control", b"no-store")
_STATUS_CLASSES = frozenset({"1xx", "2xx", "3xx", "4xx", "5xx", "error"})


def _asset(name: str) -> bytes:
    return resources.files("gateway.live").joinpath("ui", name).read_bytes()


async def _respond(send: Send, status: int, headers: RawHeaders, body: bytes = b"") -> None:
    headers = [*headers, *_COMMON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _error(send: Send, exc: GatewayError) -> None:
    headers: RawHeaders = [_JSON, _NO_STORE, *exc.headers]
    await _respond(send, exc.status, headers, exc.body())


async def _json(send: Send, obj: Any) -> None:
    await _respond(send, 200, [_JSON, _NO_STORE], orjson.dumps(obj))


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


def _cookie(scope: Scope, name: str) -> str | None:
    for k, v in scope["headers"]:
        if k == b"cookie":
            for part in v.decode("latin-1").split(";"):
                key, _, value = part.strip().partition("=")
                if key == name and value:
                    return unquote(value)
    return None


def display_url(url: str) -> str:
    """A backend URL without credentials or query (what the view may show).

    >>> display_url("https://user:secret@api.example.com:8443/v1?key=abc")
    'https://api.example.com:8443/v1'
    >>> display_url("mock://?ttft_ms=50")
    'mock://?ttft_ms=50'
    """
    parts = urlsplit(url)
    if parts.scheme == "mock":  # the built-in mock: its knobs are all there is to see
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"

    def __init__(self, message: str, *, code: str, headers: Sequence[tuple[bytes, bytes]]) -> None:
        super().__init__(message, code=code)
        self.headers = headers


class LiveView:
    """The view's endpoints (one object per app; per-request state stays in locals)."""

    def __init__(self, config: Config) -> None:
        self.prefix = config.ui.path
        self._auth_on = config.auth.mode != "off"
        self._slow_ms = config.logging.slow_ms
        self._capture = config.tracing.capture_content
        # shipped in the package (package-data): read once, served from memory
        self._assets = {sub: (_asset(file), ctype) for sub, (file, ctype) in _ASSETS.items()}

    def endpoints(self) -> dict[str, Endpoint]:
        """Path -> endpoint, for the app's endpoint table."""
        p = self.prefix
        table: dict[str, Endpoint] = {p.rstrip("/"): self.redirect}
        table.update({p + sub: self.asset for sub in self._assets})
        table[p + "api/requests"] = self.requests
        table[p + "api/stream"] = self.stream
        table[p + "api/backends"] = self.backends
        table[p + "api/session"] = self.session
        return table

    # ------------------------------------------------------------ auth

    async def admit(self, rt: Runtime, scope: Scope) -> GatewayError | None:
        """None when the caller may read the view; else the error to answer with."""
        if not self._auth_on:
            return None
        ctx = rt.edge.accept(scope)  # the credential from Authorization / api-key / x-api-key
        if ctx.credential is None:
            cookie = _cookie(scope, COOKIE)
            ctx.credential = cookie.encode() if cookie else None
        if not ctx.credential:
            return Unauthorized(
                "the live view needs an admin key: send Authorization: Bearer <key> "
                "or sign in on the page",
                code="missing_api_key",
            )
        # who the key is, without spending its request budget on the view
        try:
            entry = rt.auth.identify(ctx.credential)
        except GatewayError as exc:
            return exc
        if not entry.admin:
            return Forbidden(
                "this key may not open the live view: its [[auth.keys]] entry needs admin = true",
                code="admin_required",
            )
        return None

    def _allowed_method(self, scope: Scope, *methods: str) -> GatewayError | None:
        if scope["method"] in methods:
            return None
        return MethodNotAllowed(
            f"{scope['method']} is not allowed here (allowed: {', '.join(methods)})",
            code="method_not_allowed",
            headers=((b"allow", ", ".join(methods).encode()),),
        )

    # ------------------------------------------------------------ page and assets

    async def redirect(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        await _respond(send, 308, [(b"location", self.prefix.encode())])

    async def asset(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        problem = self._allowed_method(scope, "GET", "HEAD")
        if problem is not None:
            await _error(send, problem)
            return
        body, ctype = self._assets[scope["path"][len(self.prefix) :]]
        headers: RawHeaders = [
            (b"content-type", ctype),
            (b"cache-control", b"no-cache"),
            (b"content-security-policy", _CSP),
        ]
        if scope["method"] == "HEAD":
            headers.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await _respond(send, 200, headers, body)

    # ------------------------------------------------------------ the API

    async def _guard(self, rt: Runtime, scope: Scope, send: Send, *methods: str) -> bool:
        problem = self._allowed_method(scope, *methods) or await self.admit(rt, scope)
        if problem is None and rt.recent is None:
            problem = NotFound("the live view is not enabled", code="ui_disabled")
        if problem is not None:
            await _error(send, problem)
            return False
        return True

    async def requests(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """The buffer as JSON: the records that match the filters, newest first (at most
        ``limit``), and their p50/p90/p99 (all of them, whatever the limit)."""
        if not await self._guard(rt, scope, send, "GET"):
            return
        assert rt.recent is not None
        try:
            query = RecordQuery(scope.get("query_string", b""), rt.recent.size, self._slow_ms)
        except InvalidRequest as exc:
            await _error(send, exc)
            return
        records = query.select(rt.recent.records(query.after))
        body = {
            "requests": records[: query.limit],
            "stats": stats(records),
            "buffer": {"size": rt.recent.size, "count": len(rt.recent), "last": rt.recent.last_seq},
            "slow_ms": self._slow_ms,
            "capture_content": self._capture,
            "auth": self._auth_on,
            "now": round(time.time(), 3),
        }
        await _json(send, body)

    async def backends(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        if not await self._guard(rt, scope, send, "GET"):
            return
        assert rt.recent is not None
        records = rt.recent.records()
        body = {
            "backends": [backend_row(b, records) for b in rt.backends.values()],
            # what /readyz reports next to the backends
            "cache": rt.cache.state(),
            "tracing": rt.tracing.state(),
        }
        await _json(send, body)

    async def session(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """POST: check the key in Authorization and keep it in the view's cookie; DELETE: forget."""
        problem = self._allowed_method(scope, "POST", "DELETE")
        key = self._header_key(scope)
        if problem is None and scope["method"] == "POST":
            if self._auth_on and key is None:  # a session is made from a key, not a cookie
                problem = Unauthorized(
                    "send the key as Authorization: Bearer <key>", code="missing_api_key"
                )
            problem = problem or await self.admit(rt, scope)
        if problem is not None:
            await _error(send, problem)
            return
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        attrs = f"; Path={self.prefix}; HttpOnly; SameSite=Strict{secure}"
        if scope["method"] == "DELETE":
            cookie = f"{COOKIE}=; Max-Age=0{attrs}"
        else:
            cookie = f"{COOKIE}={quote(key or '', safe='')}{attrs}" if self._auth_on else ""
        headers: RawHeaders = [_NO_STORE]
        if cookie:
            headers.append((b"set-cookie", cookie.encode("latin-1")))
        await _respond(send, 204, headers)

    @staticmethod
    def _header_key(scope: Scope) -> str | None:
        raw = _header(scope, b"authorization")
        if raw is not None and raw[:7].lower() == b"bearer ":
            return raw[7:].strip().decode("latin-1") or None
        raw = _header(scope, b"api-key") or _header(scope, b"x-api-key")
        return raw.strip().decode("latin-1") if raw else None

    async def stream(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """The live feed (SSE): backlog after Last-Event-ID / ?after=, then each new request."""
        if not await self._guard(rt, scope, send, "GET"):
            return
        assert rt.recent is not None
        try:
            after = _resume_point(scope)
        except InvalidRequest as exc:
            await _error(send, exc)
            return
        await feed(rt.recent, after, receive, send)


async def feed(recent: RecentRequests, after: int | None, receive: Receive, send: Send) -> None:
    """One watcher's SSE response, until it ends (:data:`STREAM_MAX_S`), falls behind or the
    client goes away. Queued events are written together: one send per wake-up."""
    watcher = recent.watch(after)
    loop = asyncio.get_running_loop()
    timer = loop.call_later(STREAM_MAX_S, watcher.close)

    async def watch_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        watcher.close()

    gone = asyncio.ensure_future(watch_disconnect())
    headers: RawHeaders = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
        *_COMMON,
    ]
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        first = f"retry: {STREAM_RETRY_MS}\n\n".encode()
        await send({"type": "http.response.body", "body": first, "more_body": True})
        while (batch := await _next_batch(watcher.queue)) is not None:
            await send({"type": "http.response.body", "body": batch, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        recent.unwatch(watcher)
        timer.cancel()
        gone.cancel()


async def _next_batch(queue: asyncio.Queue[tuple[int, bytes] | None]) -> bytes | None:
    """Every event queued now as one write (waits for the first); None: the feed ended
    (what was queued before the end marker is written first)."""
    item = await queue.get()
    events = []
    while item is not None:
        seq, record = item
        # the seq is the event id: EventSource sends it back as Last-Event-ID on reconnect
        events.append(b"id: %d\nevent: request\ndata: %s\n\n" % (seq, record))
        if queue.empty():
            return b"".join(events)
        item = queue.get_nowait()
    if events:
        queue.put_nowait(None)  # write these, end on the next call
        return b"".join(events)
    return None


def _resume_point(scope: Scope) -> int | None:
    last = _header(scope, b"last-event-id")
    if last is None:
        raw = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))).get("after")
        last = raw.encode() if raw is not None else None
    if last is None or not last.strip():
        return None
    try:
        value = int(last)
    except ValueError:
        raise InvalidRequest(
            "after / Last-Event-ID must be an integer", code="invalid_after"
        ) from None
    return max(0, value)


class RecordQuery:
    """The filters of ``api/requests`` (the page's filters, for scripts):
    ``status`` (``2xx``… ``5xx``, ``error`` or a code), ``model``, ``route``, ``slow=1``
    (``request_ms >= logging.slow_ms``), ``after`` (sequence number) and ``limit``."""

    __slots__ = ("after", "limit", "model", "route", "slow", "slow_ms", "status")

    def __init__(self, query: bytes, size: int, slow_ms: float) -> None:
        params = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))
        unknown = set(params) - {"status", "model", "route", "slow", "after", "limit"}
        if unknown:
            raise InvalidRequest(f"unknown query parameter(s): {', '.join(sorted(unknown))}")
        self.status = params.get("status") or None
        if self.status is not None and not (
            self.status in _STATUS_CLASSES or (self.status.isdigit() and len(self.status) == 3)
        ):
            raise InvalidRequest(
                "status must be 1xx..5xx, error or a status code", code="invalid_status"
            )
        self.model = params.get("model") or None
        self.route = params.get("route") or None
        self.slow = params.get("slow", "") in ("1", "true", "yes")
        self.slow_ms = slow_ms
        self.after = _int_param(params, "after", 0, 0)
        self.limit = _int_param(params, "limit", size, 1)

    def select(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if self.matches(r)]

    def matches(self, r: Mapping[str, Any]) -> bool:
        if self.model is not None and r["model"] != self.model:
            return False
        if self.route is not None and r["route"] != self.route:
            return False
        if self.slow and r["request_ms"] < self.slow_ms:
            return False
        return self.status is None or status_matches(self.status, r)


def status_matches(wanted: str, r: Mapping[str, Any]) -> bool:
    """Whether a record's status is what the ``status`` filter asks for.

    >>> status_matches("4xx", {"status": 404, "error": None})
    True
    >>> status_matches("error", {"status": 200, "error": {"type": "upstream_stream_truncated"}})
    True
    """
    status: int = r["status"]
    if wanted == "error":
        return status >= 400 or r["error"] is not None
    if wanted.endswith("xx"):
        return status // 100 == int(wanted[0])
    return status == int(wanted)


def _int_param(params: Mapping[str, str], name: str, default: int, low: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer", code=f"invalid_{name}") from None
    if value < low:
        raise InvalidRequest(f"{name} must be at least {low}", code=f"invalid_{name}")
    return value


def backend_row(b: Backend, records: list[dict[str, Any]]) -> dict[str, Any]:
    """A backend as the view shows it: config, health, and what the buffer saw of it.

    Health comes from the backend's ``health_state()`` when it has one (passive health:
    ejection, SPEC §13); until then every backend is reported in rotation, as ``/readyz``
    and ``gateway_backend_up`` do.
    """
    cfg = b.config
    transport = "mock" if cfg.is_mock else "h2" if cfg.http2 else "http/1.1"
    health: dict[str, Any] = {"up": True, "source": "no passive health state"}
    probe = getattr(b, "health_state", None)
    if callable(probe):
        try:
            health = {**dict(probe()), "source": "passive health"}
        except Exception as exc:  # the view degrades; it never fails because of it
            health = {"up": None, "source": f"health_state() failed: {type(exc).__name__}"}
    attempts = [a for r in records for a in r["attempts"] if a["backend"] == b.name]
    failed = [a for a in attempts if a["error"] is not None or (a["status"] or 0) >= 500]
    return {
        "name": b.name,
        "provider": b.provider,
        "url": display_url(cfg.url),
        "transport": transport,
        "health": health,
        "attempts": len(attempts),
        "failed": len(failed),
        "last_status": attempts[0]["status"] if attempts else None,
        "attempt_ms": percentiles([a["dur_ms"] for a in attempts]),
    }


__all__ = ["COOKIE", "LiveView", "RecordQuery", "backend_row", "display_url"]
