"""The canonical request target (gateway/target.py, docs/spec.md §25) as properties over generated
paths: the form is idempotent, never holds a dot segment, an encoded separator or path
parameters, means what the client's spelling meant, and is exactly what the upstream receives."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.target import BadTarget, canonical_path, canonical_scope, is_canonical
from tests.support import GatewayServer, ScriptedUpstream, answering, gateway_config, running
from tests.test_security import CHAT, config, status

#: pieces a hostile path is made of: plain characters, escapes of unreserved, reserved and
#: refused characters in both cases, dots, separators, path parameters, controls, 8-bit bytes
PIECES = [
    "a", "Z", "0", "-", "_", "~", ".", "..", ":", "@", "!", "$", "&", "'", "(", "*", "+", ",", "=",
    "%41", "%61", "%2e", "%2E", "%2d", "%7e", "%7E", "%3a", "%3A", "%40", "%21",
    "%2f", "%2F", "%5c", "%5C", "%3b", "%3B", "%25", "%3f", "%23", "%00", "%0a", "%0D", "%7f",
    "%20", "%22", "%3c", "%5b", "%7b", "%c3%a9", "%C3%A9", "%fF", "%e2%80%ae",
    "\\", ";", "..;", ".;", ";x=1", "%", "%g1", "%2", "é", " ", "\x00", "\x7f", '"', "{",
]  # fmt: skip
segment = st.lists(st.sampled_from(PIECES), max_size=5).map("".join)
paths = st.lists(segment, min_size=1, max_size=6).map(lambda s: ("/" + "/".join(s)).encode())


def _segments(path: bytes) -> list[bytes]:
    return [s for s in path.split(b"/") if s]


@given(paths)
@settings(max_examples=3000, deadline=None)
def test_the_canonical_form_is_idempotent_and_safe(path: bytes) -> None:
    try:
        canonical = canonical_path(path)
    except BadTarget:
        return
    assert canonical_path(canonical) == canonical
    assert is_canonical(canonical)
    assert canonical_scope({"path": canonical.decode("ascii"), "raw_path": canonical})
    assert canonical == b"/" or not canonical.endswith(b"/")
    assert b"//" not in canonical
    segments = _segments(canonical)
    assert not any(s in (b".", b"..") for s in segments)
    decoded = [unquote_to_bytes(s) for s in segments]
    assert not any(d in (b".", b"..") for d in decoded)
    # no second separator, no path parameters, no control character: raw or once decoded
    for forbidden in (b"/", b"\\", b";", b"%", b"?", b"#"):
        assert not any(forbidden in d for d in decoded)
    assert b"%2F" not in canonical.upper() and b"%5C" not in canonical.upper()
    assert not any(c < 0x20 or c == 0x7F for d in decoded for c in d)
    # the same path: every non-empty segment decodes to the same bytes as the client's
    assert decoded == [unquote_to_bytes(s) for s in _segments(path)]


@given(paths)
@settings(max_examples=500, deadline=None)
def test_what_is_refused_holds_something_a_canonical_path_may_not(path: bytes) -> None:
    try:
        canonical_path(path)
    except BadTarget:
        decoded = [unquote_to_bytes(s) for s in _segments(path)]
        raw_bad = any(c < 0x21 or c > 0x7E or c in b'\\;"{' for c in path)
        assert (
            raw_bad
            or any(d in (b".", b"..") for d in decoded)
            or any(ch in d for d in decoded for ch in (b"/", b"\\", b";", b"%", b"?", b"#"))
            or any(c < 0x20 or c == 0x7F for d in decoded for c in d)
            or re.search(rb"%(?![0-9A-Fa-f]{2})", path) is not None  # a malformed escape
        )


# ---------------------------------------------------------------- what the upstream receives


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[GatewayServer, ScriptedUpstream]]:
    up = ScriptedUpstream(answering(CHAT))
    with running(up):
        gw = GatewayServer(gateway_config(config(f"http://127.0.0.1:{up.port}/base/v1")))
        with running(gw):
            yield gw, up


def _exchange(port: int, target: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@given(st.sampled_from([b"/v1/things", b"/v1/responses"]), paths)
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_upstream_receives_exactly_the_canonical_path(
    served: tuple[GatewayServer, ScriptedUpstream], base: bytes, path: bytes
) -> None:
    gw, up = served
    target = base + path
    if any(c <= 0x20 or c >= 0x7F for c in target):
        return  # not a request line httptools reads at all (a 400 from the parser)
    up.requests.clear()
    answer = _exchange(gw.port, target)
    try:
        canonical = canonical_path(target)
    except BadTarget:
        assert status(answer) == 400, (target, answer[:200])
        assert up.requests == []
        return
    assert status(answer) == 200, (target, answer[:200])
    (seen,) = up.requests
    assert seen.target == "/base" + canonical.decode("ascii")
