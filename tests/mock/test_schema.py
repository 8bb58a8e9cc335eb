"""Values made to fit JSON schemas (gateway/mock/schema.py): checked by the pydantic models the
schemas come from, as the openai SDK's ``parse`` helpers check them."""

from __future__ import annotations

from datetime import date, datetime, time
from typing import Any, Literal
from uuid import UUID

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

from gateway.mock.schema import MAX_DEPTH, fake, pieces


def words() -> str:
    return "lazy fox"


class Address(BaseModel):
    street: str
    postcode: str = Field(min_length=5, max_length=5)


class Node(BaseModel):
    name: str
    children: list[Node] = []
    parent: Node | None = None


class Everything(BaseModel):
    name: str
    age: int = Field(ge=18, lt=30)
    ratio: float = Field(gt=0, lt=1)
    step: int = Field(multiple_of=7, ge=10)
    negative: int = Field(le=-5)
    below: float = Field(lt=-2.0)
    kind: Literal["a", "b"]
    when: datetime
    day: date
    at: time
    ident: UUID
    address: Address
    others: list[Address]
    tags: list[str] = Field(min_length=3)
    pair: tuple[int, str]
    tree: Node
    maybe: int | None
    flag: bool
    scores: dict[str, int]
    short: str = Field(max_length=3)
    long: str = Field(min_length=40)


@pytest.mark.parametrize(
    "schema",
    [Everything.model_json_schema(), to_strict_json_schema(Everything)],
    ids=["pydantic", "openai-strict"],
)
def test_a_value_for_every_kind_of_field_validates(schema):
    value = fake(schema, words)
    model = Everything.model_validate(value)
    assert model.kind == "a" and model.flag is True and model.maybe == 1
    assert model.age == 18 and 0 < model.ratio < 1 and model.step == 14
    assert model.negative == -5 and model.below < -2
    assert len(model.tags) == 3 and model.tags[0] == "lazy fox" and len(model.long) >= 40
    assert orjson.loads(orjson.dumps(value)) == value  # plain JSON


def test_recursion_is_bounded_and_still_valid():
    value = fake(Node.model_json_schema(), words)
    assert Node.model_validate(value).children  # one level is made, the recursion stops there
    assert len(orjson.dumps(value)) < 1000
    forever = {"$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}},
               "required": ["n"]}}, "$ref": "#/$defs/N"}  # fmt: skip
    depth, value = 0, fake(forever, words)
    while isinstance(value, dict):
        depth, value = depth + 1, value["n"]
    assert MAX_DEPTH < depth <= 4 * MAX_DEPTH + 1  # no finite valid value: it ends anyway
    assert fake({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, words) is None


@pytest.mark.parametrize(
    ("schema", "want"),
    [
        ({"type": "string", "format": "email"}, "mock@example.com"),
        ({"type": "integer", "exclusiveMinimum": 5, "maximum": 9}, 6),
        ({"type": "integer", "minimum": 0, "maximum": 0}, 0),
        ({"type": "number", "minimum": 2, "maximum": 3}, 2.5),
        ({"type": "number", "exclusiveMaximum": 1.5}, 0.5),
        ({"type": "integer", "minimum": 3, "exclusiveMinimum": True}, 4),  # draft-04
        ({"type": ["null", "boolean"]}, True),
        ({"const": {"x": [1]}}, {"x": [1]}),
        ({"enum": [None, 2]}, None),
        ({"anyOf": [{"type": "null"}, {"type": "integer"}]}, 1),
        ({"type": "array", "maxItems": 0, "items": {"type": "string"}}, []),
        ({"type": "array", "items": [{"type": "integer"}, {"type": "boolean"}]}, [1, True]),
        ({"type": "object", "required": ["x"]}, {"x": "lazy fox"}),
        ({"allOf": [{"$ref": "#/$defs/A"}, {"properties": {"b": {"type": "null"}}}],
          "$defs": {"A": {"properties": {"a": {"type": "integer"}}}}}, {"a": 1, "b": None}),
        (True, "lazy fox"),
        ({}, "lazy fox"),
    ],
)  # fmt: skip
def test_per_keyword_values(schema: Any, want: Any):
    assert fake(schema, words) == want


def test_string_bounds_hold_whatever_the_words():
    class Code(BaseModel):
        code: str = Field(min_length=8, max_length=8)
        note: str = Field(min_length=2)

    for source in ("", "a", "a rather long sentence"):
        Code.model_validate(fake(Code.model_json_schema(), lambda s=source: s))


@given(st.text())
def test_pieces_join_back_to_the_text(text):
    cut = pieces(text)
    assert "".join(cut) == text
    assert all(cut)


def test_json_is_cut_into_many_small_pieces():
    text = orjson.dumps({"city": "Paris, France", "days": [1, 2]}).decode()
    assert pieces(text) == ['{"', "city", '":"', "Paris", ",", " France", '","', "days", '":[',
                            "1", ",", "2", "]}"]  # fmt: skip
