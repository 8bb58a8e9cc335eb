"""The built-in live view (docs/spec.md §18): recent requests and their hop waterfall.

Endpoints under ``[ui] path`` (``/_gateway/``), all answered here, outside any request scope:

=================================  ==================================================
``GET {path}``                     the page (``ui/index.html`` + ``live.js`` + ``live.css``)
``GET {path}api/requests``         the ring buffer's records as JSON, newest first, with stats
``GET {path}api/stream``           the live feed: one SSE event per finished request
``GET {path}api/backends``         backends with their passive health, as ``/readyz`` has it
``POST|DELETE {path}api/session``  sign in (sets the view's session cookie) / sign out
``GET {path}api/spend``            budgets per tenant and key: spent, reserved, reset (§20)
``GET {path}api/realtime``         the realtime sessions open now, newest first (§19)
=================================  ==================================================

The view's own requests are not recorded, traced or access-logged (they never enter a
:class:`~gateway.scope.RequestScope`), and neither are ``/healthz``, ``/readyz`` and
``/metrics``: the buffer holds the traffic the gateway serves, not the traffic of its watchers.
Every answer goes out through :class:`~gateway.writer.ResponseWriter` (errors in the OpenAI
shape), with a context of its own that no sink ever sees.

Auth (``auth.mode = "keys"``): the API needs a key whose ``[[auth.keys]]`` entry has
``admin = true``, sent as ``Authorization: Bearer`` / ``api-key`` / ``x-api-key`` (scripts), or —
browsers cannot put a header on an ``EventSource`` — the session cookie that
``POST {path}api/session`` sets after checking the key the page's sign-in form sends: a signed,
expiring token (:mod:`gateway.live.sign_in`), never the key nor a digest of it; ``HttpOnly``,
``SameSite=Strict``, ``Path`` the view's path, ``Secure`` when the request came over TLS (or
``X-Forwarded-Proto: https`` from a trusted proxy). Keys are never accepted in the URL (URLs end
up in browser history, proxy logs and ``Referer``) and never logged. No key or session: 401; a
key that is not admin: 403. The page and its two static files carry no data and are served to
anyone who reaches the port.

Live feed: the stream first sends what the buffer holds after ``Last-Event-ID`` (or
``?after=SEQ``), then each new request; each watcher has a bounded queue and is dropped when it
falls behind. A stream ends after :data:`STREAM_MAX_S` and the browser's ``EventSource``
reconnects with ``Last-Event-ID``, so nothing is lost — and an open page never holds a
graceful shutdown for longer than that (the drain waits for open responses before it stops).
"""

from __future__ import annotations

import asyncio
import html
import os
import time
from collections.abc import Mapping
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from gateway.config import Config
from gateway.context import RequestContext, Timeline
from gateway.errors import (
    Forbidden,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    Unauthorized,
)
from gateway.hops.auth import KeyEntry
from gateway.live.recent import RecentRequests, percentiles, stats
from gateway.live.sign_in import SignInTokens, secret_from
from gateway.routes import Backend
from gateway.runtime import Endpoint, Runtime
from gateway.types import RawHeaders, Receive, Scope, Send
from gateway.writer import ResponseWriter

#: the session cookie (a signed token: :mod:`gateway.live.sign_in`)
COOKIE = "gateway_ui_session"
#: the cookie of earlier versions, which held the admin key itself: deleted when seen
LEGACY_COOKIE = "gateway_ui_key"
#: a live-feed response ends after this long; EventSource reconnects (Last-Event-ID)
STREAM_MAX_S = 5.0
#: the browser's reconnect delay (ms), sent as the stream's ``retry:``
STREAM_RETRY_MS = 500
_ASSETS = {
    "": ("index.html", b"text/html; charset=utf-8"),
    "live.js": ("live.js", b"text/javascript; charset=utf-8"),
    "live.css": ("live.css", b"text/css; charset=utf-8"),
    # the Keys page (docs/spec.md §28): its data comes from the admin API, with the admin key
    "keys": ("keys.html", b"text/html; charset=utf-8"),
    "keys.js": ("keys.js", b"text/javascript; charset=utf-8"),
}
_CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    b"img-src 'self' data:; base-uri 'self'; form-action 'none'; frame-ancestors 'none'"
)
#: on every answer of the view
_COMMON: RawHeaders = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
_NO_STORE = (b"cache-control", b"no-store")
_STATUS_CLASSES = frozenset({"1xx", "2xx", "3xx", "4xx", "5xx", "error"})
#: passive-health states (gateway/fleet/health.py) as the page words them
STATE_LABELS = {
    "up": "in rotation",
    "ejected": "ejected",
    "probe_due": "ejected (probe due)",
    "probing": "probing",
}


def _asset(name: str) -> bytes:
    return resources.files("gateway.live").joinpath("ui", name).read_bytes()


def _writer(ctx: RequestContext, send: Send, *extra: tuple[bytes, bytes]) -> ResponseWriter:
    """The one response writer (gateway/writer.py) over a context no sink ever sees."""
    ctx.response_headers = [*_COMMON, *extra]
    return ResponseWriter(ctx, send, None)


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


def over_tls(ctx: RequestContext) -> bool:
    """Whether the client reached us over TLS: our own listener's, or a trusted proxy's that
    says so in ``X-Forwarded-Proto`` (the first value: the client's side of the chain)."""
    if ctx.scope.get("scheme") == "https":
        return True
    if not ctx.peer_trusted:
        return False
    proto = _header(ctx.scope, b"x-forwarded-proto")
    return proto is not None and proto.split(b",")[0].strip().lower() == b"https"


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


def _allowed_method(scope: Scope, *methods: str) -> None:
    if scope["method"] not in methods:
        raise MethodNotAllowed(
            f"{scope['method']} is not allowed here (allowed: {', '.join(methods)})",
            allow=", ".join(methods),
            code="method_not_allowed",
        )


class LiveView:
    """The view's endpoints (one object per app; per-request state stays in locals)."""

    def __init__(self, config: Config, environ: Mapping[str, str] | None = None) -> None:
        self.prefix = config.ui.path
        self._auth_on = config.auth.mode != "off"
        self._slow_ms = config.logging.slow_ms
        #: the mode shown beside the records: text is in them only with "full"
        self._capture = config.tracing.capture_content
        # shipped in the package (package-data): read once, served from memory
        self._assets = {sub: (_asset(file), ctype) for sub, (file, ctype) in _ASSETS.items()}
        # the page is served at the prefix with or without its "/" (one canonical path,
        # docs/spec.md §25): a <base> makes its relative URLs (live.js, api/...) resolve under
        # the prefix either way
        page, ctype = self._assets[""]
        base = b'<head>\n<base href="' + html.escape(self.prefix).encode() + b'">'
        self._assets[""] = (page.replace(b"<head>", base, 1), ctype)
        env = os.environ if environ is None else environ
        self.sessions = SignInTokens(config.auth.keys, secret_from(env))
        # RFC 6265 §4.1.1: a path-value has no ';' or controls (the configured path is ours)
        path = quote(self.prefix, safe="/:@!$&'()*+,=-._~%")
        self._cookie_attrs = f"; Path={path}; HttpOnly; SameSite=Strict"

    def endpoints(self) -> dict[str, Endpoint]:
        """Path -> endpoint, for the app's endpoint table."""
        p = self.prefix
        # the canonical target has no trailing "/" (docs/spec.md §25): the page is at p[:-1]
        table: dict[str, Endpoint] = {(p + sub).rstrip("/"): self.asset for sub in self._assets}
        table[p + "api/requests"] = self.requests
        table[p + "api/stream"] = self.stream
        table[p + "api/backends"] = self.backends
        table[p + "api/session"] = self.session
        table[p + "api/spend"] = self.spend
        table[p + "api/realtime"] = self.realtime
        return table

    # ------------------------------------------------------------ auth

    def admit(self, rt: Runtime, ctx: RequestContext) -> None:
        """Return when the caller may read the view; else raise the error to answer with."""
        if not self._auth_on:
            return
        if ctx.credential:  # a key in Authorization / api-key / x-api-key
            self.admin_key(rt, ctx.credential)
            return
        token = _cookie(ctx.scope, COOKIE)
        if token is None:
            raise Unauthorized(
                "the live view needs an admin key: send Authorization: Bearer <key> "
                "or sign in on the page",
                code="missing_api_key",
            )
        if self.sessions.check(token) is None:
            raise Unauthorized(
                "the live view's session is not valid (expired or signed out): sign in again",
                code="invalid_session",
            )

    @staticmethod
    def admin_key(rt: Runtime, credential: bytes) -> KeyEntry:
        """The key's entry when it may open the view (who it is, without spending its request
        budget on the view); else raise 401 / 403."""
        entry = rt.auth.identify(credential)
        if not entry.admin:
            raise Forbidden(
                "this key may not open the live view: its [[auth.keys]] entry needs admin = true",
                code="admin_required",
            )
        return entry

    # ------------------------------------------------------------ page and assets

    async def asset(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        out = _writer(RequestContext(scope, Timeline()), send)
        try:
            _allowed_method(scope, "GET", "HEAD")
        except GatewayError as exc:
            await out.error(exc)
            return
        # the page's path is the prefix without its "/": what follows the prefix is then ""
        body, ctype = self._assets[scope["path"][len(self.prefix) :]]
        headers: RawHeaders = [
            (b"content-type", ctype),
            (b"cache-control", b"no-cache"),
            (b"content-security-policy", _CSP),
        ]
        if scope["method"] == "HEAD":
            headers.append((b"content-length", str(len(body)).encode()))
            await out.start(200, headers)
            await out.body(b"")
            return
        await out.whole(200, headers, body)

    # ------------------------------------------------------------ the API

    async def _open(
        self, rt: Runtime, scope: Scope, send: Send, *methods: str
    ) -> ResponseWriter | None:
        """The writer of an API answer when the caller may have it; None when refused."""
        ctx = rt.edge.accept(scope)
        out = _writer(ctx, send, _NO_STORE)
        try:
            _allowed_method(scope, *methods)
            self.admit(rt, ctx)
            if rt.recent is None:
                raise NotFound("the live view is not enabled", code="ui_disabled")
        except GatewayError as exc:
            await out.error(exc)
            return None
        return out

    async def requests(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """The buffer as JSON: the records that match the filters, newest first (at most
        ``limit``), and their p50/p90/p99 (all of them, whatever the limit)."""
        out = await self._open(rt, scope, send, "GET")
        if out is None:
            return
        assert rt.recent is not None
        try:
            query = RecordQuery(scope.get("query_string", b""), rt.recent.size, self._slow_ms)
        except InvalidRequest as exc:
            await out.error(exc)
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
        await out.json(200, body)

    async def backends(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        out = await self._open(rt, scope, send, "GET")
        if out is None:
            return
        assert rt.recent is not None
        records = rt.recent.records()
        health = rt.health.snapshot()  # what /readyz reports
        body = {
            "backends": [backend_row(b, health[b.name], records) for b in rt.backends.values()],
            # what /readyz reports next to the backends
            "cache": rt.cache.state(),
            "tracing": rt.tracing.state(),
        }
        await out.json(200, body)

    async def spend(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """Budgets per tenant and per key (named by tenant and a digest prefix, never the key):
        period, spent, reserved, budget, reset (docs/spec.md §20); admins only with auth on."""
        out = await self._open(rt, scope, send, "GET")
        if out is not None:
            await out.json(200, await rt.auth.spend())

    async def realtime(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """The realtime sessions open in this process now (docs/spec.md §19), newest first:
        each one's own :meth:`~gateway.context.LiveSession.view` (asked here, when somebody
        reads, never on the session's path). Finished sessions are records of ``api/requests``."""
        out = await self._open(rt, scope, send, "GET")
        if out is None:
            return
        views = [s.view() for s in list(rt.sessions.values())]
        views.sort(key=lambda v: v["started_ns"], reverse=True)
        await out.json(200, {"open": views, "now": round(time.time(), 3)})

    async def session(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """POST: check the admin key in the headers and set the session cookie; DELETE: sign
        the cookie's session out (in this process: :mod:`gateway.live.sign_in`) and delete it."""
        ctx = rt.edge.accept(scope)
        out = _writer(ctx, send, _NO_STORE)
        secure = "; Secure" if over_tls(ctx) else ""
        cookies: list[str] = []
        try:
            _allowed_method(scope, "POST", "DELETE")
            if scope["method"] == "DELETE":
                token = _cookie(scope, COOKIE)
                if token is not None:
                    self.sessions.revoke(token)
                cookies.append(f"{COOKIE}=; Max-Age=0{self._cookie_attrs}{secure}")
            elif self._auth_on:
                if not ctx.credential:  # a session is made from a key, never from a cookie
                    raise Unauthorized(
                        "send the key as Authorization: Bearer <key>", code="missing_api_key"
                    )
                digest = self.admin_key(rt, ctx.credential).digest
                if not self.sessions.knows(digest):  # a sign-in identity (docs/spec.md §29)
                    raise Forbidden(
                        "a live-view session is signed in with an admin key; send a bearer "
                        "token as Authorization: Bearer with each request instead",
                        code="admin_key_required",
                    )
                token = self.sessions.issue(digest)
                age = self.sessions.ttl_s
                cookies.append(f"{COOKIE}={token}; Max-Age={age}{self._cookie_attrs}{secure}")
        except GatewayError as exc:
            await out.error(exc)
            return
        if _cookie(scope, LEGACY_COOKIE) is not None:
            cookies.append(f"{LEGACY_COOKIE}=; Max-Age=0{self._cookie_attrs}{secure}")
        # 204: no body and no content-length (RFC 9110 §8.6)
        await out.start(204, [(b"set-cookie", c.encode("latin-1")) for c in cookies])
        await out.body(b"")

    async def stream(self, rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        """The live feed (SSE): backlog after Last-Event-ID / ?after=, then each new request."""
        out = await self._open(rt, scope, send, "GET")
        if out is None:
            return
        assert rt.recent is not None
        try:
            after = _resume_point(scope)
        except InvalidRequest as exc:
            await out.error(exc)
            return
        await feed(rt.recent, after, receive, out)


async def feed(
    recent: RecentRequests, after: int | None, receive: Receive, out: ResponseWriter
) -> None:
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
        (b"x-accel-buffering", b"no"),
    ]
    try:
        await out.start(200, headers)
        await out.body(f"retry: {STREAM_RETRY_MS}\n\n".encode(), more=True)
        while (batch := await _next_batch(watcher.queue)) is not None:
            await out.body(batch, more=True)
        await out.body(b"")
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


def failed(r: Mapping[str, Any]) -> bool:
    """Whether a record reads as a failure: an error, or a status of 400 and above — but not an
    MCP GET no server has a stream for (its 405 is the answer MCP gives, docs/spec.md §23)."""
    if r["error"] is not None:
        return True
    mcp = r.get("mcp")
    return r["status"] >= 400 and not (mcp is not None and mcp.get("status") == "no_stream")


def status_matches(wanted: str, r: Mapping[str, Any]) -> bool:
    """Whether a record's status is what the ``status`` filter asks for.

    >>> status_matches("4xx", {"status": 404, "error": None})
    True
    >>> status_matches("error", {"status": 200, "error": {"type": "upstream_stream_truncated"}})
    True
    >>> status_matches("error", {"status": 405, "error": None, "mcp": {"status": "no_stream"}})
    False
    """
    status: int = r["status"]
    if wanted == "error":
        return failed(r)
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


def backend_row(
    b: Backend, health: Mapping[str, Any], records: list[dict[str, Any]]
) -> dict[str, Any]:
    """A backend as the view shows it: config, passive health, what the buffer saw of it.

    ``health`` is the backend's row of :meth:`gateway.fleet.health.Health.snapshot` — what
    ``/readyz`` reports — as it is, with the page's wording of its state (``label``) and the
    models out of rotation on it (``models``: model -> state, empty when none). ``load`` is its
    model server's queue and KV-cache as last scraped (docs/spec.md §21; ``known`` false while
    unknown), None when its load is not read.

    >>> from gateway.config import BackendConfig
    >>> b = Backend(BackendConfig(name="b", url="http://127.0.0.1:9/v1"), None)
    >>> row = backend_row(b, {"state": "up", "up": True, "models": {"m": "ejected"}}, [])
    >>> row["health"]["label"], row["health"]["models"]
    ('in rotation', {'m': 'ejected'})
    """
    cfg = b.config
    transport = "mock" if cfg.is_mock else "h2" if cfg.http2 else "http/1.1"
    state = health["state"]
    shown = {"models": {}, **health, "label": STATE_LABELS.get(state, state)}
    attempts = [a for r in records for a in r["attempts"] if a["backend"] == b.name]
    failed = [a for a in attempts if a["error"] is not None or (a["status"] or 0) >= 500]
    return {
        "name": b.name,
        "provider": b.provider,
        "url": display_url(cfg.url),
        "transport": transport,
        "health": shown,
        "load": health.get("load"),
        "attempts": len(attempts),
        "failed": len(failed),
        "last_status": attempts[0]["status"] if attempts else None,
        "attempt_ms": percentiles([a["dur_ms"] for a in attempts]),
    }


__all__ = ["COOKIE", "LiveView", "RecordQuery", "backend_row", "display_url", "over_tls"]
