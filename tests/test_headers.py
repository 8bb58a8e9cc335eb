"""gateway/headers.py: which upstream response headers reach the client."""

from __future__ import annotations

import pytest

from gateway.headers import copy_headers


@pytest.mark.parametrize("connection", [b"keep-alive", b"close", b"Keep-Alive"])
def test_hop_by_hop_and_framing_headers_never_pass(connection: bytes):
    upstream = [
        (b"connection", connection),
        (b"keep-alive", b"timeout=5"),
        (b"content-length", b"2"),
        (b"transfer-encoding", b"chunked"),
        (b"server", b"nginx"),
        (b"content-type", b"application/json"),
        (b"openai-processing-ms", b"12"),
    ]
    assert copy_headers(upstream) == [
        (b"content-type", b"application/json"),
        (b"openai-processing-ms", b"12"),
    ]


def test_headers_named_by_connection_are_dropped_too():
    upstream = [
        (b"connection", b"keep-alive, X-Internal"),
        (b"x-internal", b"secret"),
        (b"x-other", b"1"),
        (b"vary", b"Accept-Encoding"),  # the gateway sends its own
        (b"vary", b"Origin"),
    ]
    assert copy_headers(upstream) == [(b"x-other", b"1"), (b"vary", b"Origin")]
