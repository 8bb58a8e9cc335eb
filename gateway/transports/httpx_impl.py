"""HTTP/2 upstream transport on httpx2, for backends with ``http2 = true`` (docs/spec.md §1).

``https://`` backends negotiate h2 by ALPN (falling back to HTTP/1.1); plain ``http://``
backends speak h2c with prior knowledge, as vLLM/Envoy-style h2c listeners expect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx2

from gateway.config import BackendConfig
from gateway.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.transports.base import Body
from gateway.types import RawHeaders


@contextmanager
def map_upstream_errors(*, during_body: bool = False) -> Iterator[None]:
    """Translate httpx2 exceptions into gateway errors, most specific first (docs/architecture.md,
    habit 6)."""
    try:
        yield
    except httpx2.ConnectTimeout as exc:
        raise UpstreamTimeout(
            "timed out connecting to the upstream",
            code="upstream_connect_timeout",
            request_sent=False,
        ) from exc
    except (httpx2.ReadTimeout, httpx2.WriteTimeout, httpx2.PoolTimeout) as exc:
        what = "the upstream response body" if during_body else "the upstream's response headers"
        raise UpstreamTimeout(
            f"timed out waiting for {what}", code="upstream_read_timeout"
        ) from exc
    except httpx2.ConnectError as exc:
        raise UpstreamConnectError(f"cannot connect to the upstream: {exc}") from exc
    except httpx2.RemoteProtocolError as exc:
        raise UpstreamError(
            f"upstream broke the HTTP protocol: {exc}", code="upstream_bad_framing"
        ) from exc
    except httpx2.TransportError as exc:
        raise UpstreamError(f"upstream connection failed: {exc}", code="upstream_reset") from exc


class HttpxResponse:
    __slots__ = ("_resp", "headers", "status")
    #: no socket times from this client library (the hop times the attempt)
    started_at = sent_at = first_byte_at = done_at = None

    def __init__(self, resp: httpx2.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.headers: RawHeaders = [(k.lower(), v) for k, v in resp.headers.raw]

    def complete_body(self, limit: int) -> bytes | None:
        return None  # the client library reads the body: always through aiter_raw

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        with map_upstream_errors(during_body=True):
            async for chunk in self._resp.aiter_raw():
                yield chunk

    async def aclose(self) -> None:
        await self._resp.aclose()


class HttpxTransport:
    def __init__(self, backend: BackendConfig) -> None:
        tls = urlsplit(backend.url).scheme == "https"
        self._client = httpx2.AsyncClient(
            http1=tls,  # h2c has no upgrade dance here: prior knowledge on plain http
            http2=True,
            limits=httpx2.Limits(
                max_connections=backend.max_connections,
                max_keepalive_connections=backend.max_connections,
                # httpcore checks it whenever the pool is used (it has no timer of its own)
                keepalive_expiry=backend.idle_timeout_s,
            ),
            timeout=httpx2.Timeout(
                connect=backend.connect_timeout_s,
                read=backend.read_timeout_s,
                write=backend.read_timeout_s,
                pool=backend.read_timeout_s,
            ),
            follow_redirects=False,
            trust_env=False,
        )

    async def request(
        self, method: str, url: str, headers: list[tuple[str, str]], body: Body
    ) -> HttpxResponse:
        request = self._client.build_request(method, url, headers=headers, content=body)
        # httpx2 adds its own defaults; the client's choices (already in `headers`) win, and the
        # gateway must not invent an Accept-Encoding the caller of this transport did not set.
        if not any(k.lower() == "accept-encoding" for k, _ in headers):
            request.headers.pop("accept-encoding", None)
        with map_upstream_errors():
            resp = await self._client.send(request, stream=True)
        return HttpxResponse(resp)

    async def aclose(self) -> None:
        await self._client.aclose()
