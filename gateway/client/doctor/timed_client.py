"""One HTTP client for every check after the network rows: each request timed from its send,
its body decoded, its connections counted.

Requests that measure the upstream path carry ``Cache-Control: no-store`` (:func:`uncacheable`)
and a unique prompt (:func:`nonce`), so no cache replay is judged as the model's speed.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import httpx2
import orjson

from gateway.client.probe import make_ssl_context
from gateway.encoding import DecodedTooLarge, DecodeError, UnsupportedEncoding, make_decoder

__all__ = [
    "RequestFailed",
    "TimedAnswer",
    "TimedClient",
    "chat_body",
    "nonce",
    "pick_model",
    "uncacheable",
]

ACCEPT_ENCODING: Final = "br, zstd, gzip"
#: a decoded answer larger than this is a bug or a bomb, not something to measure
_MAX_DECODED: Final = 64 * 1024 * 1024
USER_AGENT: Final = "gateway-doctor/1"


@dataclass(slots=True)
class TimedAnswer:
    """One answer: its head, when it came, its body decoded (and per read, for streams)."""

    status: int
    headers: httpx2.Headers
    http_version: str
    #: seconds from sending the request to its response headers
    ttfb: float
    #: bytes over the wire (still coded) and decoded
    wire_size: int
    body: bytes
    #: (seconds since sending, decoded bytes) per read, for streams
    reads: list[tuple[float, bytes]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self, not_found: str) -> str:
        """``HTTP 401: Invalid API key`` from an OpenAI-shaped error body (or just the status);
        ``not_found`` is what a 404 probably means (see :meth:`TimedClient.check_base`)."""
        message = ""
        try:
            obj = orjson.loads(self.body)
            err = obj.get("error") if isinstance(obj, dict) else None
            message = str(err.get("message", "")) if isinstance(err, dict) else ""
        except orjson.JSONDecodeError:
            message = self.body[:120].decode(errors="replace").strip()
        text = f"HTTP {self.status}" + (f": {message[:120]}" if message else "")
        if self.status in (401, 403):
            text += " (pass the key's env var with --api-key-env)"
        elif self.status == 404:
            text += f" ({not_found})"
        return text


class RequestFailed(Exception):
    """No answer to judge: a transport error or an undecodable body, as one line."""


class TimedClient:
    """One httpx2 client (HTTP/2 when ALPN offers it), built before any request is timed."""

    def __init__(
        self, base: str, *, api_key: str | None, cacert: str | None, timeout: float
    ) -> None:
        self.base = base
        self.connections = 0
        #: what a 404 probably means; :meth:`check_base` sharpens it
        self.not_found = "check --model and the base URL"
        #: ``did you mean BASE/v1?`` once :meth:`check_base` found the API there
        self.v1_hint: str | None = None
        self._base_checked = False
        headers = {"user-agent": USER_AGENT}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.client = httpx2.Client(
            http2=True,
            trust_env=False,  # like the probe: the direct path is what is measured
            verify=make_ssl_context(cacert),
            timeout=timeout,
            headers=headers,
        )

    def __enter__(self) -> TimedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def error(self, answer: TimedAnswer) -> str:
        return answer.error(self.not_found)

    def check_base(self) -> None:
        """After a 404 (once): when the base lacks ``/v1`` and ``BASE/v1/models`` answers, every
        404 hint says ``did you mean BASE/v1?``."""
        if self._base_checked or urlsplit(self.base).path.endswith("/v1"):
            return
        self._base_checked = True
        self.not_found = "an OpenAI-compatible base URL usually ends in /v1"
        with contextlib.suppress(RequestFailed):
            if self.fetch("GET", "/v1/models").ok:
                self.v1_hint = self.not_found = f"did you mean {self.base}/v1?"

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            self.connections += 1

    def fetch(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        keep_reads: bool = False,
    ) -> TimedAnswer:
        """One request, timed from the send; the body decoded. :class:`RequestFailed` on a
        transport error or an undecodable body."""
        request = self.client.build_request(
            method,
            self.base + path,
            content=None if body is None else orjson.dumps(body),
            headers={
                "accept-encoding": ACCEPT_ENCODING,
                **({"content-type": "application/json"} if body is not None else {}),
                **(headers or {}),
            },
            extensions={"trace": self._trace},
        )
        start = time.perf_counter()
        try:
            response = self.client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            raise RequestFailed(f"{method} {path}: {_describe(exc)}") from None
        try:
            ttfb = time.perf_counter() - start
            coding = response.headers.get("content-encoding", "identity")
            decoder = make_decoder(coding, _MAX_DECODED)
            wire = 0
            parts: list[bytes] = []
            reads: list[tuple[float, bytes]] = []
            for raw in response.iter_raw():
                at = time.perf_counter() - start
                wire += len(raw)
                data = decoder.decode(raw)
                parts.append(data)
                if keep_reads and data:
                    reads.append((at, data))
            parts.append(decoder.flush())
        except httpx2.HTTPError as exc:
            raise RequestFailed(f"{method} {path}: {_describe(exc)}") from None
        except (UnsupportedEncoding, DecodeError, DecodedTooLarge) as exc:
            raise RequestFailed(f"{method} {path}: undecodable body: {exc}") from None
        finally:
            response.close()
        return TimedAnswer(
            status=response.status_code,
            headers=response.headers,
            http_version=response.http_version,
            ttfb=ttfb,
            wire_size=wire,
            body=b"".join(parts),
            reads=reads,
        )


def _describe(exc: httpx2.HTTPError) -> str:
    if isinstance(exc, httpx2.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def nonce() -> str:
    return uuid.uuid4().hex[:12]


def uncacheable() -> dict[str, str]:
    return {"cache-control": "no-store"}


def chat_body(model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        **extra,
    }


def pick_model(models: list[str], *, embedding: bool) -> str | None:
    """The first chat model (or the first embedding model) of a /models listing."""
    for m in models:
        if ("embed" in m.lower()) == embedding:
            return m
    return models[0] if models and not embedding else None
