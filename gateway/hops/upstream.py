"""The upstream hop: attempts, backoff and fallback over pooled per-backend transports.

Retries follow SPEC §13: every LLM call is a non-idempotent POST (RFC 9110 §9.2.2), so a
request is sent again only when no completion can have been produced — connect failures, and
429/502/503/504 answers — unless the route sets ``retry_on_timeout``. Retries happen before any
byte reaches the client (this hop returns at the upstream's headers). Exponential backoff with
full jitter from 100 ms; ``Retry-After`` is honoured up to :data:`RETRY_AFTER_CAP` s, beyond
that the backend is given up for this request and the next one (fallback) is tried.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from gateway.config import BackendConfig
from gateway.context import Attempt, RequestContext
from gateway.errors import GatewayError, UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.transports import Transport, UpstreamResponse, for_backend
from gateway.transports.base import Body, header_value

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 2.0
RETRY_AFTER_CAP = 2.0


class Backend:
    """A configured backend with its pooled transport (made once, in the lifespan)."""

    __slots__ = (
        "auth_header",
        "base_url",
        "config",
        "host",
        "name",
        "port",
        "provider",
        "transport",
    )

    def __init__(self, config: BackendConfig, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.config = config
        self.name = config.name
        self.provider = config.provider
        self.base_url = config.url.split("?", 1)[0].rstrip("/")
        parts = urlsplit(config.url)
        self.host = parts.hostname or "mock"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        key = env.get(config.api_key_env) if config.api_key_env else None
        #: the backend's own key; the client's Authorization never goes upstream (SPEC §5)
        self.auth_header: tuple[str, str] | None = (
            ("authorization", f"Bearer {key}") if key else None
        )
        self.transport: Transport = for_backend(config)

    def url_for(self, path: str, query: bytes) -> str:
        # the request path after /v1 is appended to the configured base URL (SPEC §4)
        url = self.base_url + path[3:]
        return f"{url}?{query.decode('latin-1')}" if query else url


#: extra headers per attempt (e.g. traceparent of the attempt's CLIENT span)
AttemptHeaders = Callable[[RequestContext, Attempt], list[tuple[str, str]]]


def _retry_allowed(exc: GatewayError, retry_on_timeout: bool) -> bool:
    if isinstance(exc, UpstreamConnectError):
        return True
    if isinstance(exc, UpstreamError | UpstreamTimeout):
        return not exc.request_sent or retry_on_timeout
    return False


def _retry_after(resp: UpstreamResponse) -> float | None:
    raw = header_value(resp.headers, b"retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP-date: treat like no hint (backoff applies)


def _backoff(retry_number: int) -> float:
    return random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (retry_number - 1)))


async def forward(
    ctx: RequestContext,
    backends: tuple[Backend, ...],
    retries: int,
    retry_on_timeout: bool,
    body: Body,
    extra_headers: AttemptHeaders | None = None,
    new_span_id: Callable[[], int] = lambda: 0,
) -> tuple[UpstreamResponse, Attempt]:
    """Send the request upstream; return the response to relay (headers in, body unread).

    Raises the last attempt's :class:`GatewayError` when every attempt failed.
    """
    if not isinstance(body, bytes | None):
        retries = 0  # a streamed request body can be sent once only
        backends = backends[:1]
    last_exc: GatewayError | None = None
    total = len(backends) * (retries + 1)
    number = 0
    delay = 0.0
    method = ctx.method
    for b_index, backend in enumerate(backends):
        url = backend.url_for(ctx.path, ctx.query)
        base_headers = ctx.upstream_headers
        if backend.auth_header is not None:
            base_headers = [*base_headers, backend.auth_header]
        last_backend = b_index == len(backends) - 1
        for _ in range(retries + 1):
            number += 1
            if delay:
                await asyncio.sleep(delay)
            attempt = Attempt(backend, number, new_span_id())
            ctx.attempts.append(attempt)
            if ctx.timeline.upstream_sent is None:
                ctx.timeline.upstream_sent = attempt.start
            headers = base_headers
            if extra_headers is not None:
                headers = [*headers, *extra_headers(ctx, attempt)]
            try:
                resp = await backend.transport.request(method, url, headers, body)
            except GatewayError as exc:
                attempt.end = time.perf_counter()
                attempt.error = exc
                last_exc = exc
                if number < total and _retry_allowed(exc, retry_on_timeout):
                    delay = _backoff(number)
                    continue
                raise
            attempt.first_byte = time.perf_counter()
            attempt.status = resp.status
            if 300 <= resp.status < 400 and resp.status != 304:
                # SPEC §13: never followed, never passed on — a key is never sent, and a client
                # never sent, to a host that config did not name
                await resp.aclose()
                attempt.end = time.perf_counter()
                attempt.error = UpstreamError(
                    f"upstream answered {resp.status} (a redirect); redirects are not followed",
                    code="upstream_redirect",
                )
                raise attempt.error
            if resp.status in RETRYABLE_STATUS and number < total:
                hint = _retry_after(resp)
                give_up = hint is not None and hint > RETRY_AFTER_CAP
                if not (give_up and last_backend):
                    await resp.aclose()
                    attempt.end = time.perf_counter()
                    if give_up:  # more patience asked than we have: fall back to the next backend
                        number = (b_index + 1) * (retries + 1)
                        delay = 0.0
                        break
                    delay = hint if hint is not None else _backoff(number)
                    continue
            ctx.timeline.upstream_first_byte = attempt.first_byte
            return resp, attempt
    assert last_exc is not None  # pragma: no cover - the last attempt returns or raises
    raise last_exc
