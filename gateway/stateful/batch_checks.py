"""A batch through the stateful endpoint (docs/spec.md §24, §20, §26): checked before it
starts, debited once when its results are read.

**Before.** A key with a budget may start a batch only if the batch's worst case
(:class:`gateway.budgets.metering.WorstCase`) fits what is left of its budgets (and its
tenant's): 429 ``budget_exceeded`` otherwise, before anything reaches a backend. An OpenAI
batch's requests are in its input file, which the gateway reads from the backend holding it
(streamed, line by line, never held whole), each line checked as a live call would be
(:class:`BatchLines`); an Anthropic batch's are in its body. The check reserves nothing for the
batch's run (a batch may take a day): it is released at once.

**After.** The results are priced as they pass (:class:`gateway.budgets.metering.ResultsTally`).
The first complete read debits them, once: the debit is claimed in the ownership map (memory,
and Redis when shared: ``SET NX``) and settled under the id ``batch:<id>`` (the output file's or
the Anthropic batch's), which the limits apply at most once per id. A second read, through any
replica, costs nothing. A read cut before its end debits nothing (the next complete one does);
results nobody reads are never debited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import orjson

from gateway.budgets.metering import Lines, ResultsTally, WorstCase
from gateway.budgets.spend import nano
from gateway.context import RequestContext
from gateway.errors import Forbidden, InvalidRequest, UpstreamError
from gateway.hops.references import Named, find, rule_for
from gateway.routes import Backend
from gateway.runtime import Runtime

log = logging.getLogger("gateway")

#: the ownership map's name for "this batch's results were debited"
_DEBITED: Final = "debited\x1f"


def _route_cap(rt: Runtime, backend: Backend | None) -> int | None:
    route = next((r for r in rt.router.routes if backend in r.backends), None)
    return route.config.max_tokens_cap if route is not None else None


class BatchLines:
    """The requests of an OpenAI batch's input file, each checked as a live call would be
    (docs/spec.md §24, §26): its model against the key's globs, the stored objects its body
    names (collected here, checked by the caller), its worst case when the key has a budget."""

    __slots__ = ("ambiguous", "denied", "named", "permits", "worst")

    def __init__(self, permits: Callable[[str], bool], worst: WorstCase | None) -> None:
        self.permits = permits
        self.worst = worst
        #: models named that the key may not call
        self.denied: set[str] = set()
        #: the stored objects the lines name
        self.named = Named()
        #: lines whose bytes could be read otherwise than the gateway read them
        self.ambiguous = 0

    def line(self, raw: bytes) -> None:
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return  # the backend refuses the line: it runs nothing
        if not isinstance(line, dict) or not isinstance(body := line.get("body"), dict):
            return
        model = body.get("model")
        if not isinstance(model, str) or not self.permits(model):
            self.denied.add(str(model))
        url = line.get("url")
        path = url.partition("?")[0].removesuffix("/") if isinstance(url, str) else ""
        rule = rule_for(path)
        named = find(rule, raw, body) if rule is not None else None
        if named is not None:
            self.ambiguous += named.ambiguous
            self.named.ids.extend(named.ids)
            self.named.loose.extend(named.loose)
        if self.worst is not None:
            embeds = path.endswith("/embeddings")
            self.worst.add(body, len(raw), "embeddings" if embeds else "chat")

    def refuse(self) -> None:
        """403 for a model the key may not call; 400 for a line that could be read two ways."""
        if self.denied:
            raise Forbidden(
                f"the batch names models this API key may not call "
                f"({', '.join(sorted(self.denied)[:10])})",
                code="model_not_allowed",
            )
        if self.ambiguous:
            raise InvalidRequest(
                f"{self.ambiguous} line(s) of the batch's input file name a stored object in a "
                "way a reader could take otherwise (a key given twice, or spelled with \\u "
                "escapes): write each key once, plainly (docs/spec.md §26)",
                code="ambiguous_batch_line",
            )


async def check_batch(
    rt: Runtime,
    ctx: RequestContext,
    payload: dict[str, Any],
    anthropic: bool,
    backends: tuple[Backend, ...],
) -> None:
    """A batch is checked before it starts (module docstring): with auth on, an OpenAI batch's
    input file is read and each line checked as a live call (403 ``model_not_allowed``, 404
    for another tenant's objects); a key with a budget may start it only when its worst case
    fits: 403 ``model_not_priced`` for a request whose model has no price, 429
    ``budget_exceeded`` when it does not fit."""
    entry = ctx.limit_key
    if entry is None or not backends:
        return  # auth off: no key to check the batch against
    worst = WorstCase(rt.auth.prices, _route_cap(rt, backends[0])) if entry.budgeted else None
    requests = payload.get("requests")
    if anthropic:  # its requests' models and objects were checked with its body
        if worst is not None and isinstance(requests, list):
            for request in requests:
                params = request.get("params") if isinstance(request, dict) else None
                worst.add(params, len(orjson.dumps(params)))
    elif isinstance(file_id := payload.get("input_file_id"), str):
        lines = BatchLines(entry.permits, worst)
        await _read_input(backends[0], file_id, Lines(lines.line))
        lines.refuse()
        await rt.ownership.place(lines.named, ctx.tenant)
    if worst is None:
        return
    if worst.unpriced:
        raise Forbidden(
            f"this API key has a budget and the batch names models without a price "
            f"({', '.join(sorted(worst.unpriced))}): add [[prices]] entries for them "
            "(docs/spec.md §20)",
            code="model_not_priced",
        )
    await rt.auth.admit_batch(ctx, worst.nano)


async def _read_input(backend: Backend, file_id: str, lines: Lines) -> None:
    """Stream a batch's input file from the backend holding it through ``lines``."""
    url = backend.url_for(f"/v1/files/{file_id}/content", b"")
    headers = backend.request_headers([("accept-encoding", "identity")])
    resp = await backend.transport.request("GET", url, headers, None)
    try:
        if resp.status != 200:
            raise UpstreamError(
                f"the batch's input file could not be read from its backend (HTTP "
                f"{resp.status}) to check its requests",
                code="batch_input_unreadable",
            )
        async for chunk in resp.aiter_raw():
            lines.feed(chunk)
        lines.end()
    finally:
        await resp.aclose()


def results_tally(rt: Runtime, ctx: RequestContext, anthropic: bool) -> ResultsTally | None:
    """A tally for a content or results download, when anything has a price."""
    prices = rt.auth.prices
    return ResultsTally(prices, anthropic) if prices else None


async def charge(
    rt: Runtime,
    ctx: RequestContext,
    object_id: str,
    tally: ResultsTally,
    ttl_s: float,
) -> None:
    """A completely read batch result's cost: debited once per batch (module docstring), and
    shown on this request (span, access log, ``gateway_cost_usd_total``) by the read that
    debits it; later reads cost 0."""
    tally.lines.end()
    if not tally.priced:
        if tally.unpriced:
            log.warning(
                "batch %s: %d result lines of models without a price", object_id, tally.unpriced
            )
        return
    answer = ctx.answer
    answer.costed = True
    answer.cost_usd = 0.0
    if not await rt.ownership.claim(_DEBITED + object_id, ttl_s):
        return  # debited by an earlier read (this replica or another)
    answer.cost_usd = tally.cost_usd
    await rt.auth.debit_batch(ctx, "batch:" + object_id, nano(tally.cost_usd))


__all__ = ["BatchLines", "charge", "check_batch", "results_tally"]
