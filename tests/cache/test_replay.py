"""Cache entries (SPEC §10): one entry serves JSON and SSE, whichever form filled it."""

from __future__ import annotations

import orjson
import pytest

from gateway.cache.replay import DONE_EVENT, Entry, StreamCollector, replay_events
from gateway.streaming import SSEParser, event_data


def chunk(delta: dict, finish: str | None = None, index: int = 0) -> bytes:
    return orjson.dumps(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 5,
            "model": "m",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
        }
    )


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "f", "arguments": "{"}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}),
    chunk({}, finish="stop"),
]
USAGE = orjson.dumps(
    {"id": "c1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
)


def collected() -> Entry:
    collector = StreamCollector("chat", 1 << 20)
    for data in [*STREAM, USAGE]:
        collector.add(data, orjson.loads(data))
    entry = collector.entry(100.0)
    assert entry is not None
    return entry


def datas(events: list[bytes]) -> list[bytes | None]:
    parser = SSEParser()
    out = []
    for event in events:
        (one,) = parser.feed(event)  # each replayed item is exactly one event
        out.append(event_data(one))
    return out


def test_encode_decode_round_trip_and_foreign_values_are_misses():
    entry = collected()
    assert Entry.decode(entry.encode()) == entry
    assert Entry.decode(b"not an entry") is None
    assert Entry.decode(b"GWC1\x00\x00\x00\x05{bad}") is None


def test_a_stream_adds_up_to_the_json_answer():
    entry = collected()
    answer = orjson.loads(entry.body)
    (choice,) = answer["choices"]
    assert answer["object"] == "chat.completion" and answer["id"] == "c1"
    assert choice["message"]["content"] == "Hello" and choice["finish_reason"] == "stop"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 2}
    assert entry.tokens == (4, 2)


def test_a_stream_filled_entry_replays_its_own_chunks_then_usage_when_asked():
    entry = collected()
    assert datas(list(replay_events(entry, include_usage=False))) == [*STREAM, b"[DONE]"]
    with_usage = datas(list(replay_events(entry, include_usage=True)))
    assert with_usage[:-2] == STREAM and with_usage[-1] == b"[DONE]"
    usage = orjson.loads(with_usage[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2
    assert datas(list(replay_events(entry, include_usage=True))) == with_usage  # kept: the same


def test_a_json_filled_entry_replays_as_a_stream():
    body = orjson.dumps(
        {
            "id": "c2",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hi"},
                    "finish_reason": "stop",
                }
            ],
        }
    )
    entry = Entry(1.0, "chat", body, None)
    events = list(replay_events(entry, include_usage=True))
    assert entry.synthesised is not None  # made once, kept for the entry's next hits
    assert list(replay_events(entry, include_usage=True)) == events
    assert events[-1] == DONE_EVENT
    chunks = [orjson.loads(d) for d in datas(events[:-1])]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hi"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)  # no usage: none sent


@pytest.mark.parametrize("limit", [10, 200])
def test_the_collector_is_bounded(limit: int):
    collector = StreamCollector("chat", limit)
    for data in STREAM:
        collector.add(data, orjson.loads(data))
    assert collector.entry(1.0) is None  # past the limit nothing is stored
