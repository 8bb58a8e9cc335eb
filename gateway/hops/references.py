"""Where a request body names stored objects, and the walk that finds them (docs/spec.md §26).

One table, :data:`REFERENCES`, says per endpoint where its body names a stored object — a file,
a vector store, a response, a conversation, a batch's input file — as paths through the JSON:

- ``a.b``: key ``b`` of the object at key ``a``;
- ``a[]``: every element of the list at ``a``; ``a[type=x]``: those whose ``type`` is ``x``;
- ``a{}``: every value of the object at ``a``;
- at the end, a string names one object, a list of strings one each, an object its ``id``.

The walk is driven by that table alone; no endpoint has a lookup of its own. What it finds is
checked against the caller's tenant by :meth:`gateway.hops.ownership.Ownership.place` before
anything is sent: an id at one of these places must be the tenant's (unknown or another
tenant's: 404).

**Cost.** A body none of whose reference keys appear in its bytes is not walked: the keys
are ASCII names, so they appear verbatim in the bytes unless a ``\\u`` escape spells one of
their characters — a few ``bytes in`` scans decide (:func:`find`).

**What the upstream reads is what was checked.** The gateway reads one JSON object; an
upstream whose parser keeps the first of two equal keys, or that reads a key spelled with
``\\u`` escapes, could read another one. So each reference key is counted in the bytes: when
the bytes hold a key more often than the parsed body does (a duplicate, an escape, a key at a
place the table does not list), the body is walked whole, every value under a reference key
anywhere is checked too (another tenant's: 404), and the body sent on is the parsed one,
re-serialised (``ambiguous``) — or, for a batch input line the gateway cannot rewrite, refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import unquote, unquote_plus

import orjson

from gateway.context import Call
from gateway.errors import InvalidRequest

#: a ``\\u`` escape of a character a reference key can have (a-z, ``_``): the key may hide
_KEY_ESCAPE: Final = re.compile(rb"\\u00(?:[67][0-9a-fA-F]|5[fF])")


def _escaped(raw: bytes) -> bool:
    """Whether ``raw`` has an escape that could spell a reference key's character (a
    one-byte scan first: most bodies have no backslash at all)."""
    return b"\\" in raw and _KEY_ESCAPE.search(raw) is not None


#: distinct ids one request may name (each is looked up before the request is sent)
MAX_REFERENCES: Final = 1000

_MESSAGES = (  # Anthropic Messages content blocks that name a file (Files API, beta)
    "messages[].content[].source.file_id",  # image / document, source type "file"
    "messages[].content[].file_id",  # container_upload
    "messages[].content[].content[].source.file_id",  # inside a tool_result
)
_RESPONSES = (
    "previous_response_id",
    "conversation",  # a string, or {"id": …}
    "input[].content[].file_id",  # input_file, input_image
    "input[].file_id",  # a content part given as an item, by a lenient reader
    "input[].output[].file_id",  # a function_call_output given as content parts
    "input[type=item_reference].id",
    "tools[].vector_store_ids",  # file_search
    "tools[].container.file_ids",  # code_interpreter's auto container
    "prompt.variables{}.file_id",  # a prompt variable that is an input_file / input_image
)
_ITEMS = (  # conversation items, as a Responses input names them
    "items[].content[].file_id",
    "items[].output[].file_id",
    "items[type=item_reference].id",
)
_TOOL_RESOURCES = (  # Assistants
    "tool_resources.code_interpreter.file_ids",
    "tool_resources.file_search.vector_store_ids",
    "tool_resources.file_search.vector_stores[].file_ids",
)
_THREAD_MESSAGES = ("attachments[].file_id", "content[].image_file.file_id")


def _under(prefix: str, paths: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(prefix + p for p in paths)


#: endpoint (the path; ``*`` one id segment) -> where its body names stored objects
REFERENCES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        # a compatible server may take a part's file_id without its "file" object
        "/v1/chat/completions": (
            "messages[].content[].file.file_id",
            "messages[].content[].file_id",
        ),
        "/v1/responses": _RESPONSES,
        "/v1/responses/input_tokens": _RESPONSES,
        "/v1/messages": _MESSAGES,
        "/v1/messages/count_tokens": _MESSAGES,
        "/v1/messages/batches": _under("requests[].params.", _MESSAGES),
        "/v1/batches": ("input_file_id",),
        "/v1/vector_stores": ("file_ids",),
        "/v1/vector_stores/*/files": ("file_id",),
        "/v1/vector_stores/*/file_batches": ("file_ids", "files[].file_id"),
        "/v1/uploads/*/complete": ("part_ids",),
        "/v1/conversations": _ITEMS,
        "/v1/conversations/*/items": _ITEMS,
        "/v1/assistants": _TOOL_RESOURCES,
        "/v1/assistants/*": _TOOL_RESOURCES,
        "/v1/threads": _TOOL_RESOURCES + _under("messages[].", _THREAD_MESSAGES),
        "/v1/threads/*": _TOOL_RESOURCES,
        "/v1/threads/runs": _TOOL_RESOURCES
        + _under("thread.", _TOOL_RESOURCES + _under("messages[].", _THREAD_MESSAGES)),
        "/v1/threads/*/messages": _THREAD_MESSAGES,
        "/v1/threads/*/runs": _under("additional_messages[].", _THREAD_MESSAGES),
        "/v1/fine_tuning/jobs": ("training_file", "validation_file"),
        "/v1/containers": ("file_ids",),
        "/v1/containers/*/files": ("file_id",),
    }
)
#: the references that pick the backend a call goes to, first found first (docs/spec.md §22)
PINS: Final = ("conversation", "previous_response_id")

_KEY, _EACH, _EACH_IF, _VALUES = range(4)
#: (kind, key name or field, value)
Step = tuple[int, str, str]
_SEGMENT = re.compile(r"([a-z_]+)(\[\]|\[([a-z_]+)=([a-z_]+)\]|\{\})?")


class _Path:
    """One compiled place: its steps, and the step that counts as its key being present."""

    __slots__ = ("at", "steps", "token")

    def __init__(self, text: str) -> None:
        steps: list[Step] = []
        self.at = -1
        self.token = ""
        for segment in text.split("."):
            m = _SEGMENT.fullmatch(segment)
            if m is None:
                raise ValueError(f"bad reference path {text!r}")
            steps.append((_KEY, m.group(1), ""))
            if m.group(1) != "id":
                self.at, self.token = len(steps) - 1, m.group(1)
            if m.group(2) == "[]":
                steps.append((_EACH, "", ""))
            elif m.group(2) == "{}":
                steps.append((_VALUES, "", ""))
            elif m.group(2) is not None:
                steps.append((_EACH_IF, m.group(3), m.group(4)))
                self.at, self.token = len(steps) - 1, m.group(4)
        self.steps = tuple(steps)


class _Node:
    """A node of a rule's paths merged into one tree (a body is walked once, whatever the
    number of places under one key)."""

    __slots__ = ("children", "counts", "ends")

    def __init__(self) -> None:
        self.children: list[tuple[Step, _Node]] = []
        #: tokens counted each time the walk arrives here (a path's key is present)
        self.counts: list[str] = []
        #: tokens whose path ends here: the value names stored objects
        self.ends: list[str] = []

    def child(self, step: Step) -> _Node:
        for have, node in self.children:
            if have == step:
                return node
        node = _Node()
        self.children.append((step, node))
        return node


class Rule:
    """An endpoint's places (a row of :data:`REFERENCES`), compiled once."""

    __slots__ = ("_held", "_narrow", "keys", "needles", "paths", "quoted", "root", "tokens", "top")

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        compiled = [_Path(p) for p in paths]
        #: this rule narrowed to the tokens a body may hold (memoised: at most 2^tokens)
        self._narrow: dict[tuple[str, ...], Rule] = {}
        self.root = _Node()
        for path in compiled:
            node = self.root
            for i, step in enumerate(path.steps):
                node = node.child(step)
                if i == path.at:
                    node.counts.append(path.token)
            node.ends.append(path.token)
        self.tokens = tuple(dict.fromkeys(p.token for p in compiled))
        #: each token as it appears in JSON bytes, counted against the parsed body
        self.quoted = tuple(b'"' + t.encode() + b'"' for t in self.tokens)
        #: the tokens that are keys (not ``type`` values): values under them are references
        self.keys = frozenset(p.steps[p.at][1] for p in compiled if p.steps[p.at][0] == _KEY)
        #: tokens only ever at the top: the parsed body's keys tell (escapes decoded)
        top = {p.token for p in compiled if p.at == 0}
        top -= {p.token for p in compiled if p.at != 0}
        self.top = tuple(top)
        #: the others, as the bytes start them (``"file_id`` finds ``"file_ids"`` too)
        starts = sorted({b'"' + t.encode() for t in self.tokens if t not in top})
        self.needles = tuple(
            n for n in starts if not any(n.startswith(m) for m in starts if m != n)
        )
        #: (token, only at the top, its start in bytes): what :meth:`narrowed` looks for
        self._held = tuple(
            (t, t in top, q[:-1]) for t, q in zip(self.tokens, self.quoted, strict=True)
        )

    def absent(self, raw: bytes, payload: dict[str, Any]) -> bool:
        """Whether the body surely names no object here: no top token among its keys, no
        other token's start in its bytes, no escape that could spell one (a few scans)."""
        for key in self.top:
            if key in payload:
                return False
        for needle in self.needles:
            if needle in raw:
                return False
        return not _escaped(raw)

    def narrowed(self, raw: bytes, payload: dict[str, Any]) -> Rule | None:
        """This rule reduced to the places whose token the body may hold (None: none), so a
        body naming only ``previous_response_id`` walks only that place."""
        if _escaped(raw):
            return self  # a key may be spelled with escapes: every place
        held = tuple([t for t, top, start in self._held if (t in payload if top else start in raw)])
        if not held:
            return None
        if len(held) == len(self.tokens):
            return self
        rule = self._narrow.get(held)
        if rule is None:
            keep = [p for p in self.paths if _Path(p).token in held]
            rule = self._narrow[held] = Rule(tuple(keep))
        return rule


class Named:
    """What a body names: ids at the table's places, ids under a reference key elsewhere,
    and whether its bytes could be read otherwise than the gateway read them."""

    __slots__ = ("ambiguous", "ids", "loose")

    def __init__(self) -> None:
        #: (token, id): each must be the caller's tenant's
        self.ids: list[tuple[str, str]] = []
        #: ids under a reference key at a place the table does not list: none may be another
        #: tenant's
        self.loose: list[str] = []
        self.ambiguous = False

    def all_ids(self) -> set[str]:
        found = {i for _, i in self.ids} | set(self.loose)
        if len(found) > MAX_REFERENCES:
            raise InvalidRequest(
                f"the request names more than {MAX_REFERENCES} stored objects",
                code="too_many_references",
            )
        return found


_EXACT: Final = {p: Rule(paths) for p, paths in REFERENCES.items() if "*" not in p}
_PATTERNS: Final = tuple(
    (tuple(p.split("/")), Rule(paths)) for p, paths in REFERENCES.items() if "*" in p
)


def rule_for(path: str) -> Rule | None:
    """The table's row for a (canonical) path, or None.

    >>> rule_for("/v1/vector_stores/vs_1/file_batches").tokens
    ('file_ids', 'file_id')
    >>> rule_for("/v1/embeddings") is None, rule_for("/v1/vector_stores/a/b/files") is None
    (True, True)
    """
    rule = _EXACT.get(path)
    if rule is not None:
        return rule
    parts = path.split("/")
    for pattern, rule in _PATTERNS:
        if len(pattern) == len(parts) and all(
            (p == "*" and bool(s)) or p == s for p, s in zip(pattern, parts, strict=True)
        ):
            return rule
    return None


def _terminal(node: Any, token: str, out: list[tuple[str, str]]) -> None:
    if isinstance(node, str):
        out.append((token, node))
    elif isinstance(node, list):
        out.extend((token, x) for x in node if isinstance(x, str))
    elif isinstance(node, dict) and isinstance(node.get("id"), str):
        out.append((token, node["id"]))


def _walk(rule: Rule, payload: Any, out: list[tuple[str, str]]) -> dict[str, int]:
    """Append what the rule's places hold in ``payload`` to ``out``; how often each token's
    key is there."""
    counts = dict.fromkeys(rule.tokens, 0)
    stack: list[tuple[Any, _Node]] = [(payload, rule.root)]
    while stack:
        node, at = stack.pop()
        for token in at.counts:
            counts[token] += 1
        for token in at.ends:
            _terminal(node, token, out)
        for (kind, name, value), child in at.children:
            if kind == _KEY:
                if isinstance(node, dict) and name in node:
                    stack.append((node[name], child))
            elif kind == _VALUES:
                if isinstance(node, dict):
                    stack.extend((v, child) for v in node.values())
            elif isinstance(node, list):
                if kind == _EACH:
                    stack.extend((element, child) for element in node)
                else:
                    stack.extend(
                        (e, child) for e in node if isinstance(e, dict) and e.get(name) == value
                    )
    return counts


def _everywhere(payload: Any) -> Iterator[tuple[str | None, Any]]:
    """Every (key, value) of every object, and (None, element) of every list, in ``payload``
    (iterative: a body nested 1000 deep is walked as any other)."""
    stack = [payload]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                yield key, value
                stack.append(value)
        elif isinstance(node, list):
            for value in node:
                yield None, value
                stack.append(value)


def _whole(rule: Rule, raw: bytes, payload: Any, named: Named, escaped: bool) -> None:
    """The body walked whole: values under a reference key anywhere (``loose``), and whether
    the bytes hold a key the parsed body lost (``ambiguous``)."""
    counts = dict.fromkeys(rule.tokens, 0)
    found: list[tuple[str, str]] = []
    for key, value in _everywhere(payload):
        if key is not None and key in counts:
            counts[key] += 1
            if key in rule.keys:
                _terminal(value, key, found)
        if isinstance(value, str) and value in counts:
            counts[value] += 1
    named.loose = [i for _, i in found]
    named.ambiguous = escaped or any(
        raw.count(q) != counts[t] for q, t in zip(rule.quoted, rule.tokens, strict=True)
    )


def find(rule: Rule, raw: bytes | None, payload: Any) -> Named | None:
    """What ``payload`` (parsed from ``raw``) names at ``rule``'s places, or None when it
    names nothing. ``raw`` None: the parsed body is what goes on (no bytes to compare)."""
    if raw is not None and isinstance(payload, dict) and rule.absent(raw, payload):
        return None  # no reference key in the body: nothing to walk
    return _found(rule, raw, payload)


def _found(rule: Rule, raw: bytes | None, payload: Any) -> Named | None:
    named = Named()
    counts = _walk(rule, payload, named.ids)
    if raw is not None:
        escaped = _escaped(raw)
        if escaped or not all(
            raw.count(q) == n if n else q not in raw
            for q, n in zip(rule.quoted, counts.values(), strict=True)
        ):
            _whole(rule, raw, payload, named, escaped)
    if not named.ids and not named.loose and not named.ambiguous:
        return None
    return named


def in_call(call: Call) -> Named | None:
    """The stored objects a model call's body names (None: none — the common case, a few
    byte scans). An ambiguous body is re-serialised: the upstream gets what was checked."""
    rule = _EXACT.get(call.path)
    if rule is None or rule.absent(call.body, call.payload):
        return None
    if (rule := rule.narrowed(call.body, call.payload)) is None:
        return None
    named = _found(rule, call.body, call.payload)
    if named is not None and named.ambiguous:
        call.body = orjson.dumps(call.payload)
    return named


#: a string that could be an object id: a short prefix, ``-`` or ``_``, then the rest
_ID_SHAPE: Final = re.compile(r"[A-Za-z][A-Za-z0-9]{0,15}[-_][A-Za-z0-9_-]{3,240}")


def id_shaped(payload: Any) -> list[str]:
    """Every string in a body that could be an object id (a passthrough body is checked for
    other tenants' ids with these: docs/spec.md §26).

    >>> id_shaped({"a": ["file-abc1", "hi there", {"b": "resp_12345"}], "c": 3})
    ['file-abc1', 'resp_12345']
    """
    found = [v for _, v in _everywhere(payload) if isinstance(v, str) and _ID_SHAPE.fullmatch(v)]
    return sorted(set(found))


def segments(path: str, query: bytes) -> list[str]:
    """The path segments and query values of a request that could be object ids.

    >>> segments("/v1/threads/thread_abc1/runs", b"after=run_xyz9&limit=2")
    ['run_xyz9', 'thread_abc1']
    """
    parts = [unquote(p) for p in path.split("/")]  # as the upstream reads them
    for pair in query.decode("latin-1").split("&"):
        parts.append(unquote_plus(pair.partition("=")[2]))
    return sorted({p for p in parts if _ID_SHAPE.fullmatch(p)})


__all__ = [
    "MAX_REFERENCES",
    "PINS",
    "REFERENCES",
    "Named",
    "Rule",
    "find",
    "id_shaped",
    "in_call",
    "rule_for",
    "segments",
]
