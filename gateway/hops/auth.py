"""The auth hop: who is calling (SPEC §12).

With ``auth.mode = "off"`` (the only mode so far) nobody is refused and there is no tenant;
the hop still runs and is timed so every trace has the same chain (SPEC §6). The client's
credential is never forwarded or logged; where a scope is needed (the cache, SPEC §10) it is
represented by :func:`credential_scope`, a digest that cannot be turned back into the key.
"""

from __future__ import annotations

import hashlib
import time

from gateway.context import RequestContext


class Auth:
    def check(self, ctx: RequestContext) -> None:
        ctx.tenant = None
        ctx.timeline.auth_done = time.perf_counter()


def credential_scope(ctx: RequestContext) -> str:
    """The tenant when auth knows one, else a digest of the client's credential ("anon": none)."""
    if ctx.tenant is not None:
        return "t:" + ctx.tenant
    if not ctx.credential:
        return "anon"
    return "k:" + hashlib.sha256(b"llm-gateway scope\0" + ctx.credential).hexdigest()[:32]
