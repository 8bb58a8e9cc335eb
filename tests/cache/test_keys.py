"""SPEC §10 keys, eligibility and request Cache-Control."""

from __future__ import annotations

import copy
import random
import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cache import keys
from gateway.cache.keys import (
    KEY_PREFIX,
    CacheDirectives,
    cache_key,
    canonical_json,
    is_cacheable,
    parse_cache_control,
)

CHAT: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    "temperature": 0,
}


def key(**overrides: Any) -> str:
    args: dict[str, Any] = {
        "namespace": "default",
        "path": "/v1/chat/completions",
        "query": b"",
        "payload": CHAT,
        "scope": "t:team-a",
        "headers": None,
    }
    args.update(overrides)
    return cache_key(**args)


# ---------------------------------------------------------------- canonical JSON


def test_canonical_json_sorted_compact() -> None:
    assert canonical_json({"b": 1, "a": {"d": [1, 2], "c": "x"}}) == (
        b'{"a":{"c":"x","d":[1,2]},"b":1}'
    )


def test_key_order_and_whitespace_do_not_matter() -> None:
    a = orjson.loads(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    b = orjson.loads(b'{"messages":[{"content":"hi","role":"user"}],\n  "model":"m"}')
    assert canonical_json(a) == canonical_json(b)
    assert key(payload=a) == key(payload=b)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"temperature": 0}, {"temperature": 0.0}),
        ({"temperature": 1}, {"temperature": 1.0}),
        ({"x": {"y": [2, {"z": 3}]}}, {"x": {"y": [2.0, {"z": 3.0}]}}),
        ({"t": 0}, {"t": -0.0}),
    ],
)
def test_integral_floats_equal_ints(left: dict[str, Any], right: dict[str, Any]) -> None:
    assert canonical_json(left) == canonical_json(right)
    assert key(payload={**CHAT, **left}) == key(payload={**CHAT, **right})


def test_non_integral_and_huge_floats_are_kept() -> None:
    assert canonical_json({"t": 0.5}) == b'{"t":0.5}'
    assert canonical_json({"t": 0.5}) != canonical_json({"t": 0})
    # beyond int64 a float stays a float (orjson cannot write the int)
    huge = orjson.loads(canonical_json({"t": 1e300}))["t"]
    assert type(huge) is float and huge == 1e300
    assert canonical_json({"t": True}) == b'{"t":true}'  # bool is not 1


def test_stream_fields_ignored_at_top_level_only() -> None:
    plain = key()
    assert key(payload={**CHAT, "stream": True}) == plain
    assert key(payload={**CHAT, "stream": False, "stream_options": {"include_usage": True}}) == (
        plain
    )
    nested = {**CHAT, "metadata": {"stream": True}}
    assert key(payload=nested) != plain


def test_canonical_json_does_not_mutate() -> None:
    payload = {"stream": True, "stream_options": {}, "b": [1.0, {"c": 2.0}], "a": 0.0}
    before = copy.deepcopy(payload)
    canonical_json(payload)
    assert payload == before
    assert type(payload["a"]) is float and type(payload["b"][0]) is float  # type: ignore[index]


json_scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)


def shuffled(value: Any, rnd: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6), st.randoms())
def test_canonical_json_ignores_key_order(payload: dict[str, Any], rnd: random.Random) -> None:
    again = shuffled(payload, rnd)
    assert canonical_json(again) == canonical_json(payload)
    # and what it writes reads back as the same body, minus the form fields
    expected = {k: v for k, v in payload.items() if k not in ("stream", "stream_options")}
    assert orjson.loads(canonical_json(payload)) == expected


# ---------------------------------------------------------------- keys


def test_key_shape() -> None:
    assert re.fullmatch(r"gateway:cache:v1:default:\{[0-9a-f]{64}\}", key())
    assert key().startswith(KEY_PREFIX)
    assert key() == key()  # stable


def test_keys_are_those_earlier_versions_wrote() -> None:
    """Entries already in Redis stay reachable: the v1 key of fixed inputs never changes (twice
    each: the second call goes through the remembered digest state)."""
    for _ in range(2):
        assert key() == (
            "gateway:cache:v1:default:"
            "{1be6310196163ce6324e446f78b64a6a2f59afab7af6c7b9c91eb49ea44b8898}"
        )
        other = key(
            namespace="ns",
            path="/v1/embeddings",
            query=b"a=1",
            payload={**CHAT, "temperature": 0.0, "stream": True, "top_p": 0.5},
            scope=None,
            headers={"OpenAI-Organization": "org-1", "OpenAI-Project": ""},
        )
        assert other == (
            "gateway:cache:v1:ns:{89f751f5ea414676e52ba60a50fde08daf915dc080e5e01607a91e8e976cdbce}"
        )


def test_remembered_digest_states_are_bounded() -> None:
    for i in range(keys._HEADS_MAX + 10):
        key(scope=f"t:{i}")
    assert len(keys._HEADS) <= keys._HEADS_MAX
    assert key(query=b"q" * 4096) not in {key(query=b"q" * 4095), key()}  # long: not remembered


def test_a_body_sent_again_byte_for_byte_has_the_key_its_payload_has() -> None:
    """The key remembered per body's bytes is the one the canonical form gives, per scope and
    every other field; bodies whose payloads are equal share it; the table is bounded."""
    raw = orjson.dumps({**CHAT, "temperature": 0.0})
    for _ in range(2):  # computed, then remembered
        assert key(payload=orjson.loads(raw), body=raw) == key(payload=orjson.loads(raw))
        assert key(payload=orjson.loads(raw), body=raw, scope="t:b") == key(
            payload=orjson.loads(raw), scope="t:b"
        )
        assert key(payload=orjson.loads(raw), body=raw, query=b"a") == key(
            payload=orjson.loads(raw), query=b"a"
        )
    spaced = b" " + raw
    assert key(payload=orjson.loads(spaced), body=spaced) == key(
        payload=orjson.loads(raw), body=raw
    )
    for i in range(keys._KEYS_MAX + 10):
        body = orjson.dumps({**CHAT, "seed": i})
        assert key(payload=orjson.loads(body), body=body) == key(payload=orjson.loads(body))
    assert len(keys._KEYS) <= keys._KEYS_MAX
    big = orjson.dumps({**CHAT, "user": "u" * keys._KEY_BODY_MAX})
    key(payload=orjson.loads(big), body=big)
    assert all(memo[-1] != big for memo in keys._KEYS)  # too big to remember


def test_scopes_never_collide() -> None:
    seen = {
        key(scope=None),
        key(scope=""),
        key(scope="t:team-a"),
        key(scope="t:team-b"),
        key(scope="k:0123"),
        key(scope="anon"),
    }
    assert len(seen) == 6


def test_namespace_changes_key() -> None:
    a, b = key(namespace="default"), key(namespace="v2")
    assert a != b
    assert a.rsplit(":", 1)[1] == b.rsplit(":", 1)[1]  # only the namespace part differs
    assert b.startswith(KEY_PREFIX + "v2:")


def test_path_and_query_count() -> None:
    assert key(path="/v1/completions") != key()
    assert key(query=b"api-version=2024-06-01") != key()
    assert key(query=b"a=1") != key(query=b"a=2")
    # fields are length-prefixed: moving bytes between path and query changes the key
    assert key(path="/v1/x", query=b"y") != key(path="/v1/", query=b"xy")


def test_org_and_project_headers() -> None:
    base = key(headers={})
    assert key(headers=None) == base
    assert key(headers={"Content-Type": "application/json"}) == base
    org = key(headers={"OpenAI-Organization": "org-1"})
    assert org != base
    assert key(headers={"openai-organization": "org-1"}) == org  # names are case-insensitive
    assert key(headers={"OPENAI-ORGANIZATION": "org-1"}) == org
    assert key(headers={"OpenAI-Organization": "org-2"}) != org
    assert key(headers={"OpenAI-Organization": ""}) != base  # absent is not empty
    project = key(headers={"OpenAI-Project": "org-1"})
    assert project not in (base, org)  # the same value in the other header differs
    both = key(headers={"OpenAI-Organization": "org-1", "OpenAI-Project": "p"})
    assert both not in (base, org, project)


# ---------------------------------------------------------------- eligibility


@pytest.mark.parametrize(
    ("operation", "payload", "mode", "expected"),
    [
        ("embeddings", {"input": "x"}, "deterministic", True),
        ("embeddings", {"input": "x", "temperature": 1}, "deterministic", True),
        ("chat", {"temperature": 0}, "deterministic", True),
        ("chat", {"temperature": 0.0}, "deterministic", True),
        ("chat", {"temperature": 0, "n": 1}, "deterministic", True),
        ("chat", {"temperature": 0, "n": None}, "deterministic", True),
        ("chat", {}, "deterministic", False),  # default temperature is 1
        ("chat", {"temperature": None}, "deterministic", False),
        ("chat", {"temperature": 0.2}, "deterministic", False),
        ("chat", {"temperature": False}, "deterministic", False),  # not a number
        ("chat", {"temperature": "0"}, "deterministic", False),
        ("chat", {"temperature": 0, "n": 2}, "deterministic", False),
        ("chat", {"temperature": 0, "n": True}, "deterministic", False),
        ("text_completion", {"temperature": 0}, "deterministic", True),
        ("text_completion", {"temperature": 0.7}, "deterministic", False),
        ("chat", {"temperature": 0.9, "n": 3}, "all", True),
        ("text_completion", {}, "all", True),
        ("embeddings", {}, "all", True),
        ("models", {}, "all", False),
        ("moderations", {"temperature": 0}, "deterministic", False),
        ("chat", {"temperature": 0}, "bogus", False),
    ],
)
def test_is_cacheable(operation: str, payload: dict[str, Any], mode: str, expected: bool) -> None:
    assert is_cacheable(operation, payload, mode) is expected


# ---------------------------------------------------------------- Cache-Control


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, CacheDirectives()),
        (b"", CacheDirectives()),
        (b"no-cache", CacheDirectives(no_cache=True)),
        (b"NO-CACHE", CacheDirectives(no_cache=True)),
        (b'no-cache="set-cookie"', CacheDirectives(no_cache=True)),
        (b"no-store", CacheDirectives(no_store=True)),
        (b"no-cache, no-store", CacheDirectives(no_cache=True, no_store=True)),
        (b"max-age=60", CacheDirectives(max_age=60.0)),
        (b"Max-Age=0", CacheDirectives(max_age=0.0)),
        (b'max-age="60"', CacheDirectives(max_age=60.0)),
        (b" no-cache ,max-age=5 ", CacheDirectives(no_cache=True, max_age=5.0)),
        (b"max-age=5, max-age=10", CacheDirectives(max_age=5.0)),  # the first counts
        (b"max-age=x, max-age=7", CacheDirectives(max_age=7.0)),  # the first valid one
        (b"max-age=99999999999999", CacheDirectives(max_age=float(2**31))),
        (b"max-age=-1", CacheDirectives()),
        (b"max-age=1.5", CacheDirectives()),
        (b"max-age=", CacheDirectives()),
        (b"max-age", CacheDirectives()),
        (b"max-age=\xd9\xa3", CacheDirectives()),  # non-ASCII digits are not DIGIT
        (b'foo="a, no-store", max-age=3', CacheDirectives(max_age=3.0)),  # quoted comma
        (b'foo="a\\", no-store", no-cache', CacheDirectives(no_cache=True)),  # escaped quote
        (b"max-stale=10, min-fresh=5, only-if-cached", CacheDirectives()),
        (b",,, ;;; \xff\x00 ,", CacheDirectives()),
        (b"no-cachex, xno-store", CacheDirectives()),
    ],
)
def test_parse_cache_control(value: bytes | None, expected: CacheDirectives) -> None:
    assert parse_cache_control(value) == expected


def test_parse_cache_control_remembers_bounded() -> None:
    first = parse_cache_control(b"max-age=42")
    assert parse_cache_control(b"max-age=42") is first
    for i in range(3 * keys._PARSED_MAX):
        assert parse_cache_control(b"max-age=%d" % i).max_age == float(i)
    assert len(keys._parsed) <= keys._PARSED_MAX
    long_value = b"no-cache, " + b"x" * 1000
    assert parse_cache_control(long_value).no_cache
    assert long_value not in keys._parsed


directive_text = st.text(
    alphabet=st.sampled_from(list('abcdefghmnorstxyz-=", \\\t;0123456789\x00\xff')), max_size=40
)


@given(st.binary(max_size=64) | directive_text.map(lambda s: s.encode("latin-1")))
def test_parse_cache_control_never_raises(value: bytes) -> None:
    directives = parse_cache_control(value)
    assert isinstance(directives, CacheDirectives)
    assert directives.max_age is None or 0 <= directives.max_age <= 2**31
