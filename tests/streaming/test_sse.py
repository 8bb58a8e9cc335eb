"""The SSE parser (gateway/streaming/sse.py): independent of chunk boundaries and line
endings (LF, CRLF, CR), multi-line data joined with LF."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.streaming import DONE, SSEParser, event_data


def _events(n_min: int = 1):
    line_text = st.text(st.characters(blacklist_characters="\r\n", codec="utf-8"), max_size=12)
    field = st.one_of(
        line_text.map(lambda t: "data: " + t),
        line_text.map(lambda t: "data:" + t),
        line_text.map(lambda t: ": " + t),  # comment
        line_text.map(lambda t: "event: " + t),
        st.just("id: 7"),
    )
    return st.lists(st.lists(field, min_size=1, max_size=4), min_size=n_min, max_size=6)


@settings(max_examples=300)
@given(
    events=_events(),
    eol=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_parser_independent_of_chunk_boundaries(events, eol, cuts):
    raw = [(eol.join(lines) + eol + eol).encode() for lines in events]
    stream = b"".join(raw)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    parts = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    parser = SSEParser()
    got: list[bytes] = []
    for p in parts:
        got.extend(parser.feed(p))
    # a CR at the very end may still be half of a CRLF until the stream ends
    got.extend(parser.finish())
    assert got == raw
    assert parser.pending == b""


@given(
    st.lists(
        st.text(st.characters(blacklist_characters="\r\n", codec="utf-8"), max_size=10),
        min_size=1,
        max_size=4,
    )
)
def test_multiline_data_is_joined_with_lf(values):
    raw = ("".join(f"data: {v}\r\n" for v in values) + "\r\n").encode()
    (event,) = SSEParser().feed(raw)
    assert event_data(event) == "\n".join(values).encode()


def test_event_data_edge_cases():
    assert event_data(b": keep-alive\n\n") is None
    assert event_data(b"data: [DONE]\n\n") == DONE
    assert event_data(b"data:[DONE]\n\n") == DONE
    assert event_data(b"data:  two spaces\n\n") == b" two spaces"
    assert event_data(b"database: x\n\n") is None
    assert event_data(b"data\n\n") == b""
    assert event_data(b"event: ping\ndata: {}\n\n") == b"{}"
