"""Which stateful call a path is (docs/spec.md §24): the collection, the object it names.

Paths after ``/v1``: ``files``, ``uploads``, ``batches``, ``conversations``, ``vector_stores``
(OpenAI) and ``messages/batches`` (Anthropic Message Batches); Anthropic's Files API shares
``/v1/files`` and is told apart by the headers only Anthropic clients send: ``anthropic-version``
(every Anthropic SDK request) or ``anthropic-beta: files-api-…``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: collection → the purpose its calls route by when nothing else decides (docs/spec.md §24)
COLLECTIONS: Final = {
    "files": "files",
    "uploads": "uploads",
    "batches": "batch",
    "conversations": "conversations",
    "vector_stores": "vector_stores",
    "messages/batches": "message_batches",
}
#: answers streamed through untouched (file contents, batch results: JSONL, maybe GBs)
_STREAMED: Final = frozenset({"content", "results"})
#: the actions after an object's id that name an operation (anything else: its method's)
_ACTIONS: Final = frozenset(
    {"content", "results", "cancel", "complete", "parts", "search", "items", "files"}
) | {"file_batches"}
#: a method on an object (or, for POST and GET, on a collection) -> its operation's verb
_VERBS: Final = {"GET": "retrieve", "POST": "update", "DELETE": "delete"}


#: per collection, what may follow an object's id (``*``: an id of the object's own items);
#: with auth on anything else is a path the gateway does not model: 404 (docs/spec.md §26)
_RESTS: Final = {
    "files": frozenset({"", "content"}),
    "uploads": frozenset({"", "parts", "complete", "cancel"}),
    "batches": frozenset({"", "cancel"}),
    "conversations": frozenset({"", "items", "items/*"}),
    "vector_stores": frozenset(
        {"", "search", "files", "files/*", "files/*/content", "file_batches", "file_batches/*"}
        | {"file_batches/*/cancel", "file_batches/*/files"}
    ),
    "messages/batches": frozenset({"", "results", "cancel"}),
}


@dataclass(frozen=True, slots=True)
class Target:
    """A stateful path taken apart: ``/v1/<collection>[/<object_id>[/<rest>]]``."""

    collection: str
    object_id: str | None
    #: what follows the id (``content``, ``cancel``, ``items/msg_1``); "" for none
    rest: str
    #: the Anthropic Files API (beta header) or Message Batches
    anthropic: bool
    #: a spelling of a collection's path that is not the path (another case, an empty id):
    #: never forwarded (docs/spec.md §26)
    malformed: bool = False

    @property
    def path(self) -> str:
        """The canonical path: one spelling, without a trailing ``/`` (docs/spec.md §26)."""
        tail = "" if self.object_id is None else "/" + self.object_id
        return f"/v1/{self.collection}{tail}{'/' if self.rest else ''}{self.rest}"

    @property
    def modelled(self) -> bool:
        """Whether what follows the object's id is a call the gateway knows (module
        docstring): ``content``, ``cancel``, ``items/<id>``, …

        >>> parse("/v1/files/f/content").modelled, parse("/v1/files/f/result%73").modelled
        (True, False)
        >>> parse("/v1/vector_stores/v/file_batches/b/files").modelled
        True
        """
        shape = "/".join("*" if i % 2 else p for i, p in enumerate(self.rest.split("/")))
        return self.object_id is None or shape in _RESTS[self.collection]

    @property
    def root(self) -> bool:
        """The collection itself (create, list)."""
        return self.object_id is None

    @property
    def streamed(self) -> bool:
        """An answer passed through chunk by chunk, never held (contents, results)."""
        return self.rest in _STREAMED

    @property
    def purpose(self) -> str:
        return COLLECTIONS[self.collection]

    def operation(self, method: str) -> str:
        """The call's operation name (docs/spec.md §24): ``<collection>.<verb>`` — bounded,
        never a client string (OpenTelemetry's GenAI conventions name no operation on
        files or batches).

        >>> parse("/v1/files").operation("POST"), parse("/v1/batches").operation("GET")
        ('files.create', 'batches.list')
        >>> parse("/v1/files/f-1/content").operation("GET")
        'files.content'
        >>> parse("/v1/messages/batches/b/results").operation("GET")
        'message_batches.results'
        >>> parse("/v1/conversations/c/whatever").operation("GET")
        'conversations.retrieve'
        """
        name = "message_batches" if self.collection == "messages/batches" else self.collection
        if self.root:
            verb = "create" if method == "POST" else "list"
        else:
            action = self.rest.partition("/")[0]
            verb = action if action in _ACTIONS else _VERBS.get(method, "other")
        return f"{name}.{verb}"


def parse(path: str, anthropic_client: bool = False) -> Target | None:
    """The stateful call ``path`` is, or None. A trailing ``/`` is the same call; another
    case of a collection's name, or an empty segment, is ``malformed``.

    >>> parse("/v1/files/file-1/content")
    Target(collection='files', object_id='file-1', rest='content', anthropic=False, malformed=False)
    >>> parse("/v1/messages/batches/msgbatch_1/results").anthropic
    True
    >>> parse("/v1/files", anthropic_client=True).anthropic
    True
    >>> parse("/v1/batches").root, parse("/v1/chat/completions"), parse("/v1/files//x").malformed
    (True, None, True)
    >>> parse("/v1/files/").path, parse("/v1/batches/b_1/cancel/").path
    ('/v1/files', '/v1/batches/b_1/cancel')
    >>> parse("/v1/Files/f-1").malformed, parse("/v1/filesx") is None
    (True, True)
    """
    if not path.startswith("/v1/"):
        return None
    rest = path[4:]
    folded = rest.lower()
    collection = next(
        (c for c in _NAMES if folded == c or folded.startswith(c + "/")),
        None,
    )
    if collection is None:
        return None
    tail = rest[len(collection) + 1 :]
    tail = tail.removesuffix("/")  # one spelling: no trailing slash
    object_id, _, after = tail.partition("/")
    malformed = (
        not rest.startswith(collection)
        or (not object_id and bool(after))
        or "//" in tail
        or tail.endswith("/")
    )
    anthropic = collection == "messages/batches" or (collection == "files" and anthropic_client)
    return Target(collection, object_id or None, after, anthropic, malformed)


#: the collections, the longest first (``messages/batches`` before any of its prefixes)
_NAMES: Final = tuple(sorted(COLLECTIONS, key=len, reverse=True))


__all__ = ["COLLECTIONS", "Target", "parse"]
