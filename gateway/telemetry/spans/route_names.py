"""The ``http.route`` of a request path, and so its SERVER span's name: a bounded set of names
whatever path the client sends (docs/spec.md §7, §22, §24)."""

from __future__ import annotations

#: routes whose path is its own http.route; other /v1/* paths are one template
_ROUTE_TEMPLATES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/realtime",
        "/v1/models",
        "/healthz",
        "/readyz",
        "/metrics",
    }
)


def route_template(path: str) -> str:
    """The span name's route: the path itself for the gateway's own routes, the Responses API's
    stateful paths with ``{response_id}`` (docs/spec.md §22), ``/v1/{path}`` for the rest — a
    bounded set of names whatever the client sends.

    >>> route_template("/v1/responses/resp_123/input_items")
    '/v1/responses/{response_id}/input_items'
    >>> route_template("/v1/files/file-1"), route_template("/v1/messages/count_tokens")
    ('/v1/files/{file_id}', '/v1/messages/count_tokens')
    >>> route_template("/v1/audio/speech")
    '/v1/{path}'
    """
    if path in _ROUTE_TEMPLATES:
        return path
    if path.startswith("/v1/responses/"):
        rest = path[len("/v1/responses/") :].split("/")
        if len(rest) == 1 or (len(rest) == 2 and rest[1] in ("cancel", "input_items")):
            return "/v1/responses/{response_id}" + ("/" + rest[1] if len(rest) == 2 else "")
    if (stateful := _stateful_template(path)) is not None:
        return stateful
    return "/v1/{path}" if path.startswith("/v1/") else path


#: the stateful collections (docs/spec.md §24) and how their span names call an object's id
_STATEFUL_IDS = {
    "/v1/messages/batches": "{message_batch_id}",
    "/v1/files": "{file_id}",
    "/v1/uploads": "{upload_id}",
    "/v1/batches": "{batch_id}",
    "/v1/conversations": "{conversation_id}",
    "/v1/vector_stores": "{vector_store_id}",
}
_STATEFUL_WORDS = frozenset(
    {
        "content",
        "cancel",
        "parts",
        "complete",
        "items",
        "results",
        "files",
        "file_batches",
        "search",
    }
)


def _stateful_template(path: str) -> str | None:
    """``/v1/files/{file_id}/content``, ``/v1/conversations/{conversation_id}/items/{id}``:
    the ids replaced, any other word as ``{path}`` (bounded names, docs/spec.md §24).

    >>> _stateful_template("/v1/files"), _stateful_template("/v1/files/file-1/content")
    ('/v1/files', '/v1/files/{file_id}/content')
    >>> _stateful_template("/v1/vector_stores/vs_1/files/file-2")
    '/v1/vector_stores/{vector_store_id}/files/{id}'
    >>> _stateful_template("/v1/batches/b/x/y/z"), _stateful_template("/v1/chat/completions")
    ('/v1/batches/{batch_id}/{path}/{id}/{path}', None)
    """
    for root, name in _STATEFUL_IDS.items():
        if path == root:
            return root
        if path.startswith(root + "/"):
            rest = path[len(root) + 1 :].split("/")
            out = [root, name]
            if len(rest) > 1:
                out.append(rest[1] if rest[1] in _STATEFUL_WORDS else "{path}")
            if len(rest) > 2:
                out.append("{id}")
            if len(rest) > 3:
                out.append("{path}")
            return "/".join(out)
    return None
