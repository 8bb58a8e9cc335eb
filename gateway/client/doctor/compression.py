"""The ``encoding`` row: the coding of an answer of at least 1 KiB asked for with
``Accept-Encoding: br, zstd, gzip`` (:func:`check_encoding` says which answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from gateway.client.doctor.report import Check
from gateway.client.doctor.timed_client import (
    RequestFailed,
    TimedAnswer,
    TimedClient,
    chat_body,
    nonce,
    uncacheable,
)

__all__ = ["check_encoding"]

#: bodies under 1 KiB rightly stay identity (docs/spec.md §9), so they say nothing about compression
MIN_ENCODED_BYTES: Final = 1024
#: only when the server lists no embedding model (see check_encoding)
ENCODING_MAX_TOKENS: Final = 300


def check_encoding(
    client: TimedClient, model: str, answer: TimedAnswer | None, embedding_model: str | None
) -> Check:
    """The coding of a >= 1 KiB answer, from the first of these that is big enough:

    1. the ttfb chat answer (rarely: it is small on purpose);
    2. an embedding of a short text with an embedding model the server lists: a vector is
       256-3072 floats, 5-60 KB of JSON on every embedding model, it costs no generation time
       and a fraction of a cent — the cheapest big answer an OpenAI-compatible API gives;
    3. otherwise a chat completion asking for a long answer (max_tokens 300): every server has
       chat/completions, but the size then depends on the model, and it takes generation time.

    Under 1 KiB after all that: ``skip`` (small bodies rightly stay identity, docs/spec.md §9).
    """
    chosen, what, largest, errors = _big_answer(client, model, answer, embedding_model)
    if chosen is None:
        if errors and not largest:
            return Check("encoding", None, None, None, "fail", "; ".join(errors))
        detail = f"largest answer {largest} B < {MIN_ENCODED_BYTES} B: too small to judge"
        return Check("encoding", None, None, None, "skip", "", detail)
    coding = chosen.headers.get("content-encoding", "").strip().lower() or "identity"
    decoded = len(chosen.body)
    if coding == "identity":
        detail = f"{decoded} B sent uncompressed; {what}"
        hint = (
            "answers >= 1 KiB go uncompressed: enable br/zstd/gzip on the server or the proxy "
            "in front of it (JSON and SSE shrink 3-10x)"
        )
        return Check("encoding", coding, None, None, "warn", hint, detail)
    ratio = decoded / chosen.wire_size if chosen.wire_size else 0.0
    detail = f"{chosen.wire_size} B on the wire for {decoded} B ({ratio:.1f}x); {what}"
    return Check("encoding", coding, None, None, "ok", "", detail)


def _big_answer(
    client: TimedClient, model: str, answer: TimedAnswer | None, embedding_model: str | None
) -> tuple[TimedAnswer | None, str, int, list[str]]:
    """(the first answer >= 1 KiB, what it was, the largest size seen, errors met)."""
    tries: list[tuple[str, Callable[[], TimedAnswer]]] = []
    if answer is not None:
        tries.append(("the ttfb chat answer", lambda: answer))
    if embedding_model:
        body = {"model": embedding_model, "input": f"gateway doctor {nonce()}"}
        tries.append(
            (
                f"an embedding from {embedding_model}",
                lambda: client.fetch("POST", "/embeddings", body, uncacheable()),
            )
        )
    prompt = f"gateway doctor {nonce()}: write the numbers from one to three hundred in words."
    chat = chat_body(model, prompt, ENCODING_MAX_TOKENS)
    tries.append(
        (
            f"a chat answer (max_tokens {ENCODING_MAX_TOKENS})",
            lambda: client.fetch("POST", "/chat/completions", chat, uncacheable()),
        )
    )
    largest, errors = 0, []
    for what, get in tries:
        try:
            candidate = get()
        except RequestFailed as exc:
            errors.append(str(exc))
            continue
        if not candidate.ok:
            errors.append(f"{what}: {client.error(candidate)}")
            continue
        largest = max(largest, len(candidate.body))
        if len(candidate.body) >= MIN_ENCODED_BYTES:
            return candidate, what, largest, errors
    return None, "", largest, errors
