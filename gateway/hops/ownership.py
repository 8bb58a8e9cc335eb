"""Which backend holds an object, and for which tenant: stateful routing (docs/spec.md §22, §24).

The Responses API keeps state on the server that answered: a follow-up naming
``previous_response_id``, and ``GET|DELETE /v1/responses/{id}``, ``POST …/cancel`` and
``GET …/input_items``, work only on the backend that created that response. Balanced over two
backends (or two replicas), every second turn would land where the id is unknown. So the
gateway remembers *response id → backend* and sends those requests to the owner, pinned: the
owner is tried even when it is ejected (the state lives only there) and its error passes through
— never a silent re-route to a backend that cannot know the id (docs/architecture.md: state that
belongs to a backend lives with the backend's health).

Where the mapping lives:

- in this process, always: a bounded LRU with the route's ``response_affinity_ttl_s`` per
  entry (:class:`gateway.store.keyvalue.MemoryKV`). Without Redis it is the only copy;
- in Redis when one is configured (``auth.redis_url``, else the ``[cache]`` Redis), so every
  replica agrees (:class:`RedisOwners`, ``SET key backend EX ttl``). A lookup asks the local LRU
  first (an id never changes owner, so a local hit is always right) and Redis on a miss. Each
  command goes through the store's guard (gateway/store/guard.py): it waits at most the Redis
  timeout and a circuit breaker stops calling a dead Redis at all: with auth off a lookup that
  Redis cannot answer routes by model; with auth on an id this process does not know is then a
  404 (docs/spec.md §26: it could be another tenant's). A record Redis cannot take is kept
  locally.

One map for every object with an id: responses, and (docs/spec.md §24) files, uploads,
batches, conversations, vector stores and Anthropic message batches, recorded by
:mod:`gateway.stateful` when their create call answers. Ids are unique across kinds (each has
its own prefix), so one map holds them all. Each entry is bound to the tenant that created the
object: the value is the backend's name, then (auth on) the unit separator and the tenant's,
and a lookup by another tenant's key is a 404 (:class:`gateway.errors.NotFound`), as if the
object did not exist — even when every tenant shares one upstream key. With auth on, an id
nobody is known to own is a 404 too, wherever a request names it (:meth:`Ownership.place`
checks what a body names, found by :mod:`gateway.hops.references`).

What is recorded for responses: the ``id`` of a 200 answer to ``POST /v1/responses`` (the
JSON body's, or the stream's ``response.created`` event's), read where the protocol already
parses the answer (:class:`gateway.protocols.responses.Responses` notes it as
``answer.response_id``), and only when the request did not say ``store: false`` (such a
response is kept nowhere). It is recorded *before the answer's first byte reaches the client*
(:class:`RecordingWriter`), so a follow-up sent the moment the answer arrives — through any
replica — finds it. A ``DELETE`` that succeeded forgets it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Final

from gateway.config import Config
from gateway.errors import NotFound
from gateway.hops.references import PINS, Named
from gateway.routes import Backend
from gateway.store.breaker import CircuitBreaker
from gateway.store.connect import shared_redis
from gateway.store.guard import RedisUnavailable
from gateway.store.keyvalue import KeyValue, MemoryKV, RedisKV
from gateway.types import RawHeaders
from gateway.writer import ResponseWriter

log = logging.getLogger("gateway")

#: entries kept in this process (~200 bytes each): the oldest go first beyond it
LOCAL_MAX_ENTRIES: Final = 100_000
#: ids come from clients (previous_response_id, paths): longer ones are never looked up
MAX_ID_CHARS: Final = 256
#: a small pool: one command per stored response and per follow-up
_MAX_CONNECTIONS: Final = 32
_PATH_PREFIX: Final = "/v1/responses/"
#: between the backend's name and the tenant's in a stored value
_SEP: Final = "\x1f"


def _value(backend: str, tenant: str | None) -> str:
    """What the map stores for an object: the backend, and the tenant when there is one.

    >>> _value("a", None), _value("a", "t1") == "a" + _SEP + "t1"
    ('a', True)
    """
    return backend if not tenant else f"{backend}{_SEP}{tenant}"


def _parse(value: str) -> tuple[str, str]:
    """(backend, tenant) of a stored value (tenant "" for an object made with auth off).

    >>> _parse("a"), _parse("a" + _SEP + "t1")
    (('a', ''), ('a', 't1'))
    """
    backend, _, tenant = value.partition(_SEP)
    return backend, tenant


def not_found(object_id: str) -> NotFound:
    """The 404 of an id this tenant does not own (or nobody is known to own)."""
    return NotFound(f"No object with id '{object_id}' found.", code="not_found")


def response_path_id(path: str) -> str | None:
    """The response id a stateful Responses path names, or None.

    >>> response_path_id("/v1/responses/resp_1"), response_path_id("/v1/responses/resp_1/cancel")
    ('resp_1', 'resp_1')
    >>> response_path_id("/v1/responses") is None, response_path_id("/v1/files/x") is None
    (True, True)
    """
    if not path.startswith(_PATH_PREFIX):
        return None
    rid = path[len(_PATH_PREFIX) :].split("/", 1)[0]
    return rid or None


class OwnersUnavailable(RedisUnavailable):
    """The shared store could not answer (error, timeout, breaker open)."""


class RedisOwners(RedisKV):
    """The map in Redis (standalone or Cluster: one key per id), shared by the replicas."""

    error = OwnersUnavailable
    what = "response ownership"

    def __init__(
        self,
        url: str,
        timeout_ms: float,
        *,
        namespace: str = "default",
        password: str | None = None,
        cluster: bool = False,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        super().__init__(
            f"gateway:response-owner:v1:{namespace}:",
            url,
            timeout_ms / 1000.0,
            password=password,
            cluster=cluster,
            max_connections=_MAX_CONNECTIONS,
            breaker=breaker,
        )

    def _down(self, exc: Exception) -> None:
        log.warning(
            "response ownership: Redis unreachable (%s); until it is back only the ids this "
            "process recorded are placed (others: by model with auth off, 404 with auth on)",
            type(exc).__name__,
        )

    def _up(self) -> None:
        log.warning("response ownership: Redis is back; replicas share response owners again")


class Ownership:
    """Response id → owning backend: the local LRU, then the shared store (if any)."""

    def __init__(
        self,
        backends: Mapping[str, Backend],
        shared: KeyValue | None = None,
        local: MemoryKV | None = None,
    ) -> None:
        self._backends = backends
        self.local = local if local is not None else MemoryKV(LOCAL_MAX_ENTRIES)
        self.shared = shared

    def for_backends(self, backends: Mapping[str, Backend]) -> Ownership:
        """The same stores naming the backends of a reloaded config (docs/spec.md §29): an id
        whose backend is gone is routed by its model."""
        return Ownership(backends, self.shared, self.local)

    async def owner(self, response_id: object, tenant: str | None = None) -> Backend | None:
        """The backend that made ``response_id`` (None: unknown, expired, not a usable id, or
        the shared store could not answer). Raises :class:`NotFound` when another tenant made
        it (docs/spec.md §24). Only for auth off: with auth on, :meth:`required` decides."""
        found = await self.lookup(response_id)
        if found is None:
            return None
        name, owner_tenant = found
        if owner_tenant != (tenant or ""):
            raise not_found(str(response_id))
        # a name this config no longer has: route by model
        return self._backends.get(name)

    async def required(self, object_id: object, tenant: str | None) -> Backend | None:
        """The owner of an object a stateful call names (docs/spec.md §24): 404 when another
        tenant made it, and — with auth on — when nobody is known to own it (an id this
        gateway did not see created could be another tenant's, behind a shared upstream key).
        None (auth off, unknown id): the caller's route rule decides."""
        found = await self.lookup(object_id)
        if found is None:
            if tenant is not None:
                raise not_found(str(object_id))
            return None
        name, owner_tenant = found
        if owner_tenant != (tenant or ""):
            raise not_found(str(object_id))
        return self._backends.get(name)

    async def place(self, named: Named, tenant: str | None) -> Backend | None:
        """Check the stored objects a request body names (docs/spec.md §26) before it is sent,
        and return the backend its ``conversation``'s, else its ``previous_response_id``'s,
        owner (None: neither, or unknown with auth off — the route decides).

        With auth on each id at one of the table's places must be the caller's tenant's, and
        none named elsewhere may be another tenant's: 404 otherwise, as a direct read is. With
        auth off only the ids that pick a backend are looked up."""
        pinned: dict[str, Backend | None] = {}
        if tenant is None:
            for token, object_id in named.ids:
                if token in PINS and token not in pinned:
                    pinned[token] = await self.required(object_id, None)
        else:
            every = named.all_ids()  # bounded (400 beyond) before anything is looked up
            checked: dict[str, Backend | None] = {}
            for token, object_id in named.ids:
                if object_id not in checked:
                    checked[object_id] = await self.required(object_id, tenant)
                if token in PINS:
                    pinned.setdefault(token, checked[object_id])
            for object_id in every - checked.keys():
                await self.not_foreign(object_id, tenant)
        return next((b for p in PINS if (b := pinned.get(p)) is not None), None)

    async def owners(self, named: Named, tenant: str | None) -> set[Backend]:
        """The backends holding the objects at the table's places (each checked as by
        :meth:`place`; unknown ones with auth off hold nothing)."""
        named.all_ids()
        found: set[Backend] = set()
        for object_id in {i for _, i in named.ids}:
            backend = await self.required(object_id, tenant)
            if backend is not None:
                found.add(backend)
        if tenant is not None:
            for object_id in set(named.loose):
                await self.not_foreign(object_id, tenant)
        return found

    async def not_foreign(self, object_id: str, tenant: str | None) -> None:
        """404 when ``object_id`` is known as another tenant's — or, with auth on, when the
        shared store cannot say whose it is (docs/spec.md §26)."""
        try:
            found = await self._find(object_id)
        except OwnersUnavailable:
            if tenant is not None:
                raise not_found(object_id) from None
            return
        if found is not None and found[1] != (tenant or ""):
            raise not_found(object_id)

    async def lookup(self, object_id: object) -> tuple[str, str] | None:
        """(backend name, tenant) of a known id; None: unknown, expired, unusable, or the
        shared store could not answer."""
        try:
            return await self._find(object_id)
        except OwnersUnavailable:
            return None

    async def _find(self, object_id: object) -> tuple[str, str] | None:
        """As :meth:`lookup`; raises :class:`OwnersUnavailable` when the shared store could not
        answer for an id this process does not know."""
        if not isinstance(object_id, str) or not 0 < len(object_id) <= MAX_ID_CHARS:
            return None
        value = self.local.get_now(object_id)
        if value is None and self.shared is not None:
            value = await self.shared.get(object_id)
        return None if value is None else _parse(value)

    async def record(
        self, response_id: str, backend: Backend, ttl_s: float, tenant: str | None = None
    ) -> None:
        if self.record_here(response_id, backend, ttl_s, tenant):
            await self.record_shared(response_id, backend, ttl_s, tenant)

    def record_here(
        self, response_id: str, backend: Backend, ttl_s: float, tenant: str | None = None
    ) -> bool:
        """Record in this process; True when the shared store is to be told too."""
        if not 0 < len(response_id) <= MAX_ID_CHARS:
            return False
        self.local.set_now(response_id, _value(backend.name, tenant), ttl_s)
        return self.shared is not None

    async def record_shared(
        self, response_id: str, backend: Backend, ttl_s: float, tenant: str | None = None
    ) -> None:
        if self.shared is not None:
            # kept here; other replicas route it by model while Redis cannot take it
            with contextlib.suppress(OwnersUnavailable):
                await self.shared.set(response_id, _value(backend.name, tenant), ttl_s)

    async def claim(self, name: str, ttl_s: float) -> bool:
        """Whether this caller is the first, of every replica, to claim ``name`` (a batch's
        debit, docs/spec.md §24): here, then in the shared store (``SET NX``). While the
        shared store cannot answer, this process's word decides."""
        if not await self.local.claim(name, ttl_s):
            return False
        if self.shared is None:
            return True
        try:
            return await self.shared.claim(name, ttl_s)
        except OwnersUnavailable:
            return True

    async def forget(self, response_id: str) -> None:
        self.local.delete_now(response_id)
        if self.shared is not None:
            # it expires; meanwhile requests for it reach the owner, which answers 404
            with contextlib.suppress(OwnersUnavailable):
                await self.shared.delete(response_id)

    def state(self) -> str:
        """For ``/readyz``: ``memory``, or the shared store's state (never a reason to be
        unready)."""
        return "memory" if self.shared is None else f"redis:{self.shared.state()}"

    async def aclose(self) -> None:
        if self.shared is not None:
            await self.shared.aclose()


class RecordingWriter(ResponseWriter):
    """The response writer of a ``POST /v1/responses`` whose answer the upstream stores: once
    the answer's id is known (the JSON body, or the stream's first events, is noted before
    anything is sent) it is recorded as owned by the answering backend, before the first byte
    that carries it goes to the client."""

    __slots__ = ("_ownership", "_ttl")

    def __init__(self, out: ResponseWriter, ownership: Ownership, ttl_s: float) -> None:
        super().__init__(out._ctx, out._send, out._hook)
        self._ownership: Ownership | None = ownership
        self._ttl = ttl_s

    async def start(self, status: int, headers: RawHeaders, follows: bool = False) -> None:
        ownership = self._ownership
        if ownership is not None:
            if status != 200:
                self._ownership = None  # an error answer: nothing was made
            elif (rid := self._ctx.answer.response_id) is not None:
                await self._record(ownership, rid)
        await super().start(status, headers, follows)

    async def body(self, data: bytes, more: bool = False) -> None:
        ownership = self._ownership
        if ownership is not None and (rid := self._ctx.answer.response_id) is not None:
            await self._record(ownership, rid)  # a stream whose first events carried no id
        await super().body(data, more)

    async def _record(self, ownership: Ownership, rid: str) -> None:
        self._ownership = None
        attempts = self._ctx.attempts
        if not attempts:
            return
        backend = attempts[-1].backend  # the attempt whose answer this is
        tenant = self._ctx.tenant  # bound to its tenant (docs/spec.md §24)
        if ownership.record_here(rid, backend, self._ttl, tenant):  # memory only: no await
            await ownership.record_shared(rid, backend, self._ttl, tenant)


def build_ownership(
    config: Config, backends: Mapping[str, Backend], environ: Mapping[str, str] | None = None
) -> Ownership:
    """Redis when ``auth.redis_url`` names one, else the ``[cache]`` Redis, else memory only."""
    redis = shared_redis(config, environ)
    if redis is None:
        return Ownership(backends)
    shared = RedisOwners(
        redis.url,
        redis.timeout_ms,
        namespace=config.cache.namespace,
        password=redis.password,
        cluster=redis.cluster,
    )
    return Ownership(backends, shared)


__all__ = [
    "LOCAL_MAX_ENTRIES",
    "OwnersUnavailable",
    "Ownership",
    "RecordingWriter",
    "RedisOwners",
    "build_ownership",
    "not_found",
    "response_path_id",
]
