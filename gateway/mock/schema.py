"""Values made to fit a JSON schema, for the mock's tool calls and structured outputs.

:func:`fake` answers a value valid for the schema a tool's ``parameters`` (or a
``response_format`` / ``text.format`` / ``output_config.format``) gives: the same value for the
same schema and the same ``text`` source, so a mock answer is deterministic like the rest of the
mock's text. Per type:

- ``object``: every property listed (required and optional; at the depth limit, required only);
- ``array``: ``minItems`` items, at least one (none at the depth limit when allowed);
- ``string``: words from ``text`` (``minLength`` / ``maxLength`` respected), or a fixed example
  for a known ``format`` (date-time, date, time, email, uri, uuid, ...); ``pattern`` is ignored;
- ``integer`` 1 and ``number`` 1.5, moved into ``minimum`` / ``maximum`` (exclusive too) and up
  to a ``multipleOf``; ``boolean`` true; ``null`` null;
- ``enum`` → its first value, ``const`` → it; ``anyOf`` / ``oneOf`` → the first branch that is
  not ``null``; ``allOf`` → its branches merged; ``$ref`` → ``#/$defs/…`` (or ``definitions``)
  of the root schema, recursion bounded by :data:`MAX_DEPTH`.

>>> schema = {"type": "object", "properties": {"city": {"type": "string"},
...     "days": {"type": "integer", "minimum": 3}, "unit": {"enum": ["c", "f"]}},
...     "required": ["city", "days", "unit"]}
>>> fake(schema, lambda: "Paris")
{'city': 'Paris', 'days': 3, 'unit': 'c'}
>>> pieces('{"city":"Paris, France"}')
['{"', 'city', '":"', 'Paris', ',', ' France', '"}']
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

#: how deep ``$ref`` / nesting goes before only what is required is made
MAX_DEPTH = 8

#: a fixed example per string ``format``
_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z",
    "date": "2025-01-01",
    "time": "00:00:00",
    "duration": "PT1H",
    "email": "mock@example.com",
    "idn-email": "mock@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "uri": "https://example.com/",
    "iri": "https://example.com/",
    "url": "https://example.com/",
    "uri-reference": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}

#: one streamed piece: a word or a run of punctuation with the spaces before it
_PIECE = re.compile(r"\s*(?:\w+|[^\w\s]+)|\s+")


def pieces(text: str) -> list[str]:
    """``text`` cut into stream pieces that join back to it exactly (the mock's "tokens")."""
    return _PIECE.findall(text)


def fake(schema: Any, text: Callable[[], str]) -> Any:
    """A value valid for ``schema``; ``text()`` gives each free string's words."""
    return _Faker(schema, text).value(schema, 0)


class _Faker:
    __slots__ = ("path", "root", "text")

    def __init__(self, root: Any, text: Callable[[], str]) -> None:
        self.root = root
        self.text = text
        #: the ``$ref``s being expanded (one met again is a recursion: made minimal)
        self.path: list[str] = []

    def value(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict):
            return self.text()  # `true` / `{}`: anything goes
        if depth > 4 * MAX_DEPTH:
            return None  # a schema that requires itself forever has no finite value
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self._ref(ref, schema, depth)
        schema = self._all_of(schema, depth)
        if "const" in schema:
            return schema["const"]
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return enum[0]
        branches = schema.get("anyOf") or schema.get("oneOf")
        if isinstance(branches, list) and branches:
            return self.value(self._branch(branches, depth), depth + 1)
        kind = _kind(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind in ("integer", "number"):
            return _number(schema, kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema)

    def _ref(self, ref: str, schema: dict[str, Any], depth: int) -> Any:
        if ref in self.path:
            depth = max(depth, MAX_DEPTH)  # a recursion: only what is required from here
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        self.path.append(ref)
        try:
            return self.value({**_lookup(self.root, ref), **rest}, depth + 1)
        finally:
            self.path.pop()

    def _all_of(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        """``allOf`` branches (``$ref``s followed) merged into one schema."""
        parts = schema.get("allOf")
        if not isinstance(parts, list) or not parts or depth > MAX_DEPTH:
            return schema
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in parts:
            for _ in range(MAX_DEPTH):
                if not isinstance(part, dict) or not isinstance(part.get("$ref"), str):
                    break
                rest = {k: v for k, v in part.items() if k != "$ref"}
                part = {**_lookup(self.root, part["$ref"]), **rest}
            if isinstance(part, dict):
                merged = _merge(merged, self._all_of(part, depth + 1))
        return merged

    def _branch(self, branches: list[Any], depth: int) -> Any:
        def is_null(b: Any) -> bool:
            return isinstance(b, dict) and b.get("type") == "null"

        if depth >= MAX_DEPTH and any(is_null(b) for b in branches):
            return {"type": "null"}
        return next((b for b in branches if not is_null(b)), branches[0])

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        required = set(required) if isinstance(required, list) else set()
        keys = [k for k in props if k in required] if depth >= MAX_DEPTH else list(props)
        out = {k: self.value(props[k], depth + 1) for k in keys}
        for key in required - out.keys():  # required but not described: any value
            out[key] = self.text()
        return out

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        items = schema.get("items", {})
        if isinstance(items, list):  # draft-04 tuples
            prefix, items = items, schema.get("additionalItems", {})
        prefix = prefix if isinstance(prefix, list) else []
        low = schema.get("minItems")
        low = low if isinstance(low, int) and low > 0 else 0
        high = schema.get("maxItems")
        count = max(low, len(prefix), 0 if depth >= MAX_DEPTH else 1)
        if isinstance(high, int) and high >= low:
            count = min(count, high)
        return [
            self.value(prefix[i] if i < len(prefix) else items, depth + 1) for i in range(count)
        ]

    def _string(self, schema: dict[str, Any]) -> str:
        known = _FORMATS.get(str(schema.get("format")))
        value = known if known is not None else self.text()
        low, high = schema.get("minLength"), schema.get("maxLength")
        if isinstance(low, int) and len(value) < low:
            value = " ".join([value or "x"] * (low // max(1, len(value)) + 1))[:low]
        if isinstance(high, int) and high >= 0 and len(value) > high:
            value = value[:high]
        return value


def _kind(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return "string"


def _lookup(root: Any, ref: str) -> dict[str, Any]:
    """``#/$defs/Name`` (a JSON pointer into the root schema) → that schema ({} if absent)."""
    if not ref.startswith("#"):
        return {}
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        key = part.replace("~1", "/").replace("~0", "~")
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two ``allOf`` branches as one: properties and required joined, the rest from both."""
    out = {**a, **b}
    if isinstance(a.get("properties"), dict) and isinstance(b.get("properties"), dict):
        out["properties"] = {**a["properties"], **b["properties"]}
    if isinstance(a.get("required"), list) and isinstance(b.get("required"), list):
        out["required"] = [*a["required"], *b["required"]]
    return out


def _number(schema: dict[str, Any], integer: bool) -> int | float:
    """1 (integer) or 1.5 (number), moved inside the bounds and up to a ``multipleOf``."""
    low = _bound(schema, "minimum", "exclusiveMinimum")
    high = _bound(schema, "maximum", "exclusiveMaximum")
    step = schema.get("multipleOf")
    if not (isinstance(step, int | float) and not isinstance(step, bool) and step > 0):
        step = None
    if integer:
        return _integer(low, high, step)
    number = 1.5
    if low is not None and (number < low[0] or (low[1] and number == low[0])):
        number = low[0] + 1 if high is None else low[0] + min(1.0, (high[0] - low[0]) / 2)
    if high is not None and (number > high[0] or (high[1] and number == high[0])):
        number = high[0] - 1 if low is None else (low[0] + high[0]) / 2
    if step is not None:
        number = math.ceil(number / step) * step
    return float(number)


def _integer(
    low: tuple[float, bool] | None, high: tuple[float, bool] | None, step: float | None
) -> int:
    lo = None if low is None else math.floor(low[0]) + 1 if low[1] else math.ceil(low[0])
    hi = None if high is None else math.ceil(high[0]) - 1 if high[1] else math.floor(high[0])
    value = 1 if lo is None else max(1, lo)
    if hi is not None and value > hi:
        value = hi if lo is None else max(hi, lo)
    if step is not None and value % step:
        return int(math.ceil(value / step) * step)
    return value


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str) -> tuple[float, bool] | None:
    """(bound, exclusive?) from draft-06+ numbers or draft-04's boolean ``exclusive*``."""
    x = schema.get(exclusive)
    v = schema.get(inclusive)
    if isinstance(x, int | float) and not isinstance(x, bool):
        return float(x), True
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v), x is True
    return None
