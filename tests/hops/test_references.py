"""The reference table and its walk (gateway/hops/references.py, docs/spec.md §26), driven by
hand-made bodies and by generated ones: the few byte scans that let a body through unwalked
never let through one that names an object, and the walk narrowed to the keys a body holds
finds what the whole table finds."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.context import Call
from gateway.errors import InvalidRequest
from gateway.hops.references import (
    MAX_REFERENCES,
    REFERENCES,
    Named,
    find,
    in_call,
    rule_for,
)


def named(path: str, body: Any, raw: bytes | None = None) -> Named | None:
    rule = rule_for(path)
    assert rule is not None
    return find(rule, orjson.dumps(body) if raw is None else raw, body)


def ids(found: Named | None) -> list[tuple[str, str]]:
    return sorted(found.ids) if found is not None else []


def test_every_row_of_the_table_compiles_and_is_found_by_its_path():
    for path in REFERENCES:
        concrete = path.replace("*", "obj_1")
        assert rule_for(concrete) is not None, path
        assert rule_for(concrete + "/more") is None or "*" not in path


@pytest.mark.parametrize(
    ("path", "body", "want"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"content": [{"type": "file", "file": {"file_id": "f1"}}]}]},
            [("file_id", "f1")],
        ),
        ("/v1/responses", {"conversation": {"id": "c1"}}, [("conversation", "c1")]),
        ("/v1/responses", {"conversation": "c1"}, [("conversation", "c1")]),
        (
            "/v1/responses",
            {"tools": [{"type": "file_search", "vector_store_ids": ["v1", "v2", 3]}]},
            [("vector_store_ids", "v1"), ("vector_store_ids", "v2")],
        ),
        (
            "/v1/responses",
            {"input": [{"type": "item_reference", "id": "i1"}, {"type": "message", "id": "m"}]},
            [("item_reference", "i1")],
        ),
        (
            "/v1/responses",
            {"prompt": {"variables": {"a": {"file_id": "f1"}, "b": "text"}}},
            [("file_id", "f1")],
        ),
        (
            "/v1/messages",
            {"messages": [{"content": [{"content": [{"source": {"file_id": "f2"}}]}]}]},
            [("file_id", "f2")],
        ),
        (
            "/v1/messages/batches",
            {"requests": [{"params": {"messages": [{"content": [{"file_id": "f3"}]}]}}]},
            [("file_id", "f3")],
        ),
        (
            "/v1/vector_stores/vs_1/file_batches",
            {"files": [{"file_id": "f4"}]},
            [("file_id", "f4")],
        ),
        ("/v1/chat/completions", {"messages": [{"content": "file_id f1"}]}, []),
    ],
)
def test_the_table_s_places(path, body, want):
    assert ids(named(path, body)) == want


def test_a_key_elsewhere_is_loose_and_two_readings_are_ambiguous():
    body = {"messages": [{"content": [{"file": {"file_id": "mine", "x": {"file_id": "other"}}}]}]}
    found = named("/v1/chat/completions", body)
    assert found is not None and sorted(found.loose) == ["mine", "other"]
    assert found is not None and not found.ambiguous  # every key in the bytes is in the parse
    twice = b'{"previous_response_id":"a","previous_response_id":"b"}'
    found = named("/v1/responses", orjson.loads(twice), twice)
    assert found is not None and found.ambiguous and ids(found) == [("previous_response_id", "b")]
    escaped = b'{"messages":[{"content":[{"file":{"fil\\u0065_id":"f"}}]}]}'
    found = named("/v1/chat/completions", orjson.loads(escaped), escaped)
    assert found is not None and found.ambiguous and ids(found) == [("file_id", "f")]
    lost_parent = b'{"input":[{"content":[{"file_id":"f"}]}],"input":"hi"}'
    found = named("/v1/responses", orjson.loads(lost_parent), lost_parent)
    assert found is not None and found.ambiguous and ids(found) == []


def test_an_ambiguous_model_call_is_re_serialised_as_checked():
    raw = b'{"model":"m","input":"x","previous_response_id":"a","previous_response_id":"b"}'
    call = Call("/v1/responses", "responses", raw, orjson.loads(raw), False, None)
    found = in_call(call)
    assert found is not None and found.ambiguous
    assert call.body == orjson.dumps(orjson.loads(raw)) and b'"a"' not in call.body
    plain = b'{"model":"m","input":"x","previous_response_id":"b"}'
    call = Call("/v1/responses", "responses", plain, orjson.loads(plain), False, None)
    assert ids(in_call(call)) == [("previous_response_id", "b")] and call.body is plain


def test_a_body_naming_too_many_objects_is_refused():
    body = {"file_ids": [f"file-{i}" for i in range(MAX_REFERENCES + 1)]}
    found = named("/v1/vector_stores", body)
    assert found is not None
    with pytest.raises(InvalidRequest):
        found.all_ids()


# ---------------------------------------------------------------- generated bodies

KEYS = ["file_id", "file_ids", "vector_store_ids", "previous_response_id", "conversation"]
KEYS += ["content", "input", "messages", "tools", "file", "source", "type", "id", "items"]
VALUES = st.sampled_from(["f1", "f2", "item_reference", "file", "input_file", "file_id"])
bodies = st.recursive(
    st.one_of(VALUES, st.integers(0, 3), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(
    body=st.dictionaries(st.sampled_from(KEYS), bodies, max_size=5),
    path=st.sampled_from(
        ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/conversations"]
    ),
)
def test_the_cheap_checks_never_let_a_named_object_through(body, path):
    raw = orjson.dumps(body)
    rule = rule_for(path)
    assert rule is not None
    whole = find(rule, None, body)  # every place walked, no shortcut
    call = Call(path, "x", raw, body, False, None)
    quick = in_call(call) if path != "/v1/conversations" else find(rule, raw, body)
    if whole is not None and whole.ids:
        assert quick is not None, body
        assert sorted(quick.ids) == sorted(whole.ids)
    if rule.absent(raw, body):
        assert whole is None or not whole.ids
