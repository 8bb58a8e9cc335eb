"""Task and context ids bound to the caller's tenant, like stored objects (docs/spec.md §26,
§30).

An A2A message carries no caller identity, and an agent behind one upstream credential serves
every tenant alike: so the gateway decides, before anything is sent, whose a task is. Each task
id and context id an agent answers with is recorded in the ownership map
(:mod:`gateway.hops.ownership`: this process, and Redis when configured) for the caller's tenant,
under ``a2a:{agent}:task:{id}`` / ``a2a:{agent}:context:{id}``, for the agent's ``task_ttl_s``.

With ``auth.mode = "keys"`` every task id a request names — ``GetTask``, ``CancelTask``,
``SubscribeToTask``, a message's ``taskId`` and ``referenceTaskIds``, a REST path — and every
context id (a message's ``contextId``, ``ListTasks``' filter) must be one of the caller's tenant:
another tenant's, an unknown one (never seen answered, expired, or only in a Redis that is down)
and a client-made context id are a ``TaskNotFoundError`` (HTTP 404 in the HTTP+JSON binding),
never forwarded. An answer naming an id another tenant holds is not relayed (502
``a2a_foreign_id``: the agent mixed its callers up); ``ListTasks`` answers keep the caller's
tenant's tasks only. With auth off nothing is recorded nor checked.
"""

from __future__ import annotations

from typing import Any

from gateway.a2a.protocol import TASK_NOT_FOUND, Facts, NamedIds, refusal
from gateway.errors import NotFound, UpstreamError
from gateway.hops.ownership import MAX_ID_CHARS, Ownership
from gateway.routes import Backend


class Binder:
    """The ids of one agent, for one request's tenant (None: auth off)."""

    __slots__ = ("_bound", "_ownership", "_prefix", "backend", "tenant", "ttl")

    def __init__(
        self, ownership: Ownership, backend: Backend, ttl_s: float, tenant: str | None
    ) -> None:
        self._ownership = ownership
        self._prefix = f"a2a:{backend.name}:"
        self.backend = backend
        self.ttl = ttl_s
        self.tenant = tenant
        #: ids this request already found (or made) its tenant's
        self._bound: set[str] = set()

    def key(self, kind: str, object_id: str) -> str:
        return f"{self._prefix}{kind}:{object_id}"

    async def check(self, named: NamedIds, rest: bool, rid: Any) -> None:
        """Every id ``named`` lists is the caller's tenant's, or the request is refused with a
        TaskNotFoundError (auth off: nothing to check)."""
        if self.tenant is None:
            return
        ids = [("task", t) for t in (named.task, *named.references) if t is not None]
        if named.context is not None:
            ids.append(("context", named.context))
        for kind, object_id in ids:
            try:
                await self._ownership.required(self.key(kind, object_id), self.tenant)
            except NotFound:
                text = f"No {kind} with id '{object_id[:MAX_ID_CHARS]}' found."
                raise refusal(rest, rid, TASK_NOT_FOUND, text, "not_found") from None
            self._bound.add(self.key(kind, object_id))

    async def bind(self, facts: Facts) -> None:
        """Record the ids an answer names for the caller's tenant; an id another tenant holds
        stops the answer (502 ``a2a_foreign_id``)."""
        if self.tenant is None:
            return
        for kind, ids in (("task", facts.tasks), ("context", facts.contexts)):
            for object_id in ids:
                key = self.key(kind, object_id)
                if key in self._bound:
                    continue
                found = await self._ownership.lookup(key)
                if found is not None and found[1] != self.tenant:
                    raise UpstreamError(
                        f"the agent {self.backend.name!r} answered with a {kind} of another "
                        "tenant: not relayed",
                        code="a2a_foreign_id",
                    )
                await self._ownership.record(key, self.backend, self.ttl, self.tenant)
                self._bound.add(key)

    async def mine(self, task: Any) -> bool:
        """Whether a listed task is the caller's tenant's (auth off: every task is)."""
        if self.tenant is None:
            return True
        if not isinstance(task, dict) or not isinstance(task.get("id"), str):
            return False
        found = await self._ownership.lookup(self.key("task", task["id"]))
        return found is not None and found[1] == self.tenant


__all__ = ["Binder"]
