"""The auth hop: who is calling (SPEC §12).

With ``auth.mode = "off"`` (the only mode so far) nobody is refused and there is no tenant;
the hop still runs and is timed so every trace has the same chain (SPEC §6). The client's
credential is never forwarded or logged.
"""

from __future__ import annotations

import time

from gateway.context import RequestContext


class Auth:
    mode = "off"

    def check(self, ctx: RequestContext) -> None:
        ctx.tenant = None
        ctx.timeline.auth_done = time.perf_counter()
