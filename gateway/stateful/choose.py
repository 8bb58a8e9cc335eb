"""Which route a stateful call goes to when no object it names decides (docs/spec.md §24).

A call that names an object goes to the backend holding it (:mod:`gateway.hops.ownership`).
One that names none — an upload, a new conversation, a list — has no ``model`` to route by, so:

1. the ``x-gateway-route: <route name>`` header, when sent (an unknown name is a 400);
2. else the first route whose ``purposes`` globs match the call's purpose (a file's or
   upload's ``purpose`` field, else the collection's: ``batch``, ``conversations``,
   ``vector_stores``, ``message_batches``, ``files``);
3. else the only route that can serve the call's API (OpenAI-shaped calls: routes whose
   backends are not ``provider = "anthropic"``; Anthropic-shaped: routes with an Anthropic or
   mock backend);
4. else a 400 ``route_required`` naming the ways to decide — never a silent first route.
"""

from __future__ import annotations

import fnmatch

from gateway.context import RequestContext
from gateway.errors import InvalidRequest
from gateway.routes import Route

#: the request header naming a route (consumed here: never sent upstream)
ROUTE_HEADER = "x-gateway-route"


def _serves(route: Route, anthropic: bool) -> bool:
    providers = {b.provider for b in route.backends}
    if anthropic:
        return bool(providers & {"anthropic", "mock"})
    return providers != {"anthropic"}


def take_route_header(ctx: RequestContext) -> str | None:
    """The ``x-gateway-route`` value, removed from what goes upstream."""
    headers = ctx.upstream_headers
    found = None
    for pair in [p for p in headers if p[0].lower() == ROUTE_HEADER]:
        found = pair[1].strip()
        headers.remove(pair)
    return found


def choose_route(
    routes: tuple[Route, ...], named: str | None, purpose: str | None, anthropic: bool
) -> Route:
    """The route for a call that names no object (module docstring); 400 when none decides."""
    if named is not None:
        for route in routes:
            if route.name == named:
                return route
        raise InvalidRequest(f"{ROUTE_HEADER}: no route named {named!r}", code="unknown_route")
    candidates = [r for r in routes if _serves(r, anthropic)]
    if purpose is not None:
        for route in candidates:
            if any(fnmatch.fnmatchcase(purpose, p) for p in route.config.purposes):
                return route
    if len(candidates) == 1:
        return candidates[0]
    what = f"purpose {purpose!r}" if purpose is not None else "this call"
    raise InvalidRequest(
        f"cannot tell which route serves {what}: it names no model and no known object; send "
        f"the {ROUTE_HEADER} header with a route name, or list the purpose in a route's "
        "`purposes` (docs/spec.md §24)",
        code="route_required",
    )


__all__ = ["ROUTE_HEADER", "choose_route", "take_route_header"]
