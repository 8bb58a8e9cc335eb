"""The gateway's exception tree, kept shallow on purpose.

::

    GatewayError                      status  type
    ├── InvalidRequest                400     invalid_request_error
    ├── Unauthorized                  401     authentication_error
    ├── Forbidden                     403     permission_error
    ├── NotFound                      404     not_found_error
    ├── NotAcceptable                 406     not_acceptable
    ├── PayloadTooLarge               413     payload_too_large
    ├── UnsupportedMediaType          415     unsupported_media_type
    ├── RateLimited                   429     rate_limit_error (+ Retry-After, x-ratelimit-*)
    ├── UpstreamError                 502     upstream_error
    │   ├── UpstreamConnectError      502     (nothing was sent: always safe to retry)
    │   └── UpstreamStreamError       502     upstream_stream_truncated / _idle_timeout
    ├── BackendSaturated              503     upstream_error, code backend_saturated (+ Retry-After)
    └── UpstreamTimeout               504     upstream_timeout

Client libraries' exceptions are translated into these at the transport boundary
(each transport's ``map_upstream_errors``); only the request scope renders them
(:meth:`gateway.writer.ResponseWriter.error`), with the OpenAI error shape
``{"error": {"message", "type", "code", "param"}}`` (docs/spec.md §5).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson


class GatewayError(Exception):
    status: int = 500
    type: str = "internal_error"
    #: whether a client may safely send the same request again (``x-should-retry``)
    should_retry: bool = False
    #: extra response headers (Retry-After, x-ratelimit-*)
    headers: Sequence[tuple[bytes, bytes]] = ()

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code)


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"


class MethodNotAllowed(GatewayError):
    """A method the path does not serve; ``Allow`` lists those it does (RFC 9110 §15.5.6)."""

    status = 405
    type = "invalid_request_error"

    def __init__(self, message: str, *, allow: str, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.headers = ((b"allow", allow.encode()),)


class NotAcceptable(GatewayError):
    status = 406
    type = "not_acceptable"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "payload_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "unsupported_media_type"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    should_retry = True

    def __init__(
        self, message: str, *, code: str | None, headers: Sequence[tuple[bytes, bytes]]
    ) -> None:
        super().__init__(message, code=code)
        self.headers = headers


class UpstreamError(GatewayError):
    """The upstream could not be reached, reset the connection or broke HTTP framing."""

    status = 502
    type = "upstream_error"
    should_retry = True

    def __init__(self, message: str, *, code: str | None = None, request_sent: bool = True) -> None:
        super().__init__(message, code=code)
        #: False when nothing can have reached the upstream (so a retry cannot duplicate work)
        self.request_sent = request_sent


class UpstreamConnectError(UpstreamError):
    """Nothing reached the upstream (refused, unreachable, DNS): always safe to retry."""

    def __init__(self, message: str, *, code: str | None = "upstream_connect_error") -> None:
        super().__init__(message, code=code, request_sent=False)


class UpstreamStreamError(UpstreamError):
    """A stream that started and then broke: reported as an SSE error event (docs/spec.md §8)."""

    def __init__(self, message: str, *, code: str = "upstream_stream_truncated") -> None:
        super().__init__(message, code=code)

    def sse_event(self) -> bytes:
        # docs/spec.md §8: the type names the cut; code is the HTTP status the answer would have
        # had.
        payload = {
            "error": {"message": self.message, "type": self.code, "code": 502, "param": None}
        }
        return b"data: " + orjson.dumps(payload) + b"\n\n"


class BackendSaturated(GatewayError):
    """Every backend of the route is saturated and the route sheds (docs/spec.md §21): nothing
    was sent upstream, the client may try again in a second."""

    status = 503
    type = "upstream_error"
    should_retry = True
    headers = ((b"retry-after", b"1"),)

    def __init__(self, message: str, *, code: str | None = "backend_saturated") -> None:
        super().__init__(message, code=code)


class UpstreamTimeout(GatewayError):
    status = 504
    type = "upstream_timeout"
    should_retry = True

    def __init__(self, message: str, *, code: str | None = None, request_sent: bool = True) -> None:
        super().__init__(message, code=code)
        self.request_sent = request_sent


def error_body(message: str, type_: str, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code, "param": None}})


class ClientGone(Exception):
    """The client went away before the answer was complete (recorded as status 499).

    Not a :class:`GatewayError`: there is nobody left to render an error to.
    """
