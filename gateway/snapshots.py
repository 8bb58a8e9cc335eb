"""Live reload: the app's config snapshots, swapped atomically (docs/spec.md §29).

The app serves one :class:`Generation` at a time: a :class:`~gateway.runtime.Runtime` and the
dispatch table made from its config. A request takes the generation current when it arrives
and keeps it to its end (counted in ``active``), so a request or stream in flight finishes on
the snapshot it began with, and every request after a reload uses the new one. A reload reads
the file again, keeps what cannot change while the process runs (:func:`merge`), builds the new
snapshot over the same :class:`~gateway.runtime.Services`, and swaps. The old generation is
retired: once its last request is over, what it alone held is closed (the pools of the backends
that changed or left, its scrapers, its MCP clients). A file that does not load, does not
validate, or would change ``auth.mode`` keeps the running snapshot, with one error line; both
outcomes count in ``gateway_config_reloads_total{result}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from gateway import endpoints, stateful
from gateway.a2a.endpoint import PREFIX as A2A
from gateway.admin.api import PREFIX as ADMIN
from gateway.admin.api import admin_endpoints
from gateway.config import Config, ConfigError, load_config
from gateway.runtime import Endpoint, Runtime, build_runtime
from gateway.target import canonical_scope
from gateway.types import Receive, Scope, Send

log = logging.getLogger("gateway")

#: the sections a reload applies; every other setting keeps its running value until a restart
RELOADED = ("backends", "routes", "prices", "mcp_servers", "agents")
#: and these of ``[auth]``: the keys, the tenants, the sign-in issuers and their grants
AUTH_RELOADED = ("keys", "tenants", "jwt")
_NOT_SETTINGS = ("source", "explicit")


class Generation:
    """One snapshot as the app serves it: the runtime, its dispatch table, its requests."""

    __slots__ = ("active", "listener", "retired", "runtime", "table")

    def __init__(
        self,
        runtime: Runtime,
        table: dict[str, Endpoint],
        listener: dict[str, Endpoint] | None = None,
    ) -> None:
        self.runtime = runtime
        self.table = table
        #: the dispatch table of the admin API's own listener (``[admin] listen``, §28)
        self.listener = listener or {}
        #: requests (and WebSocket sessions) running on it
        self.active = 0
        #: a newer generation serves: close this one once idle
        self.retired = False

    def endpoint(self, scope: Scope) -> Endpoint:
        """The endpoint of an HTTP request's path. The path is the canonical target the server
        made (docs/spec.md §25): every decision and the upstream URL are made on that one
        spelling."""
        path: str = scope["path"]
        endpoint = self.table.get(path)
        if endpoint is None:
            endpoint = endpoints.passthrough if path.startswith("/v1/") else endpoints.not_found
            endpoint = stateful.stateful if stateful.parse(path) else endpoint  # spec §24
            if path.startswith(A2A):  # A2A's HTTP+JSON binding, with [[agents]] (§30)
                endpoint = self.table.get(A2A, endpoint)
            elif path.startswith(ADMIN):  # the admin API (§28), unless it has its own listener
                endpoint = self.table.get(ADMIN, endpoint)
            if not canonical_scope(scope):  # a scope made by another server: not forwarded
                endpoint = endpoints.bad_path("the path is not in its canonical form")
        return endpoint

    def listener_endpoint(self, scope: Scope) -> Endpoint:
        """The endpoint of a request on the admin API's own listener: the admin API,
        ``/healthz`` and ``/readyz``; any other path is a 404 (docs/spec.md §28)."""
        path: str = scope["path"]
        endpoint = self.listener.get(path)
        if endpoint is None:
            table = self.listener if path.startswith(ADMIN) else {}
            endpoint = table.get(ADMIN, endpoints.not_found)
            if not canonical_scope(scope):
                endpoint = endpoints.bad_path("the path is not in its canonical form")
        return endpoint


def tables(
    made: dict[str, Endpoint], config: Config
) -> tuple[dict[str, Endpoint], dict[str, Endpoint] | None]:
    """A config's dispatch tables: the gateway's port's (``made`` and the admin API's
    endpoints), and that of the admin API's own listener with ``[admin] listen`` — which takes
    the admin API off the gateway's port (fail closed: a 404 there). ``/_gateway/api/me`` is a
    key holder's and stays on the gateway's port."""
    table = made | admin_endpoints(config)
    if config.admin.listen is None:
        return table, None
    listener: dict[str, Endpoint] = {"/healthz": endpoints.healthz, "/readyz": endpoints.readyz}
    api = table.pop(ADMIN, None)
    if api is not None:
        listener[ADMIN] = api
    return table, listener


def _changed(section: str, old: Any, new: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The key paths of ``section`` whose values differ (its own name for a plain value)."""
    if not dataclasses.is_dataclass(old):
        return [] if old == new else [section]
    return [
        f"{section}.{f.name}"
        for f in dataclasses.fields(old)
        if f.name not in skip
        and f.name not in _NOT_SETTINGS
        and getattr(old, f.name) != getattr(new, f.name)
    ]


def merge(old: Config, new: Config) -> tuple[Config, list[str]]:
    """The config a reload serves — :data:`RELOADED` and :data:`AUTH_RELOADED` from ``new``,
    every other setting from ``old`` — and the settings ``new`` changed that keep their old
    value. A change of ``auth.mode`` is refused (ConfigError): keeping the old mode would keep
    the gateway open, or closed, against what the file now says."""
    if old.auth.mode != new.auth.mode:
        raise ConfigError(
            [
                f"auth.mode: cannot change on a reload ({old.auth.mode!r} -> "
                f"{new.auth.mode!r}): restart the gateway to apply it"
            ]
        )
    kept: list[str] = []
    for f in dataclasses.fields(Config):
        if f.name in RELOADED or f.name in _NOT_SETTINGS:
            continue
        skip = AUTH_RELOADED if f.name == "auth" else ()
        kept += _changed(f.name, getattr(old, f.name), getattr(new, f.name), skip)
    auth = dataclasses.replace(
        old.auth, **{name: getattr(new.auth, name) for name in AUTH_RELOADED}
    )
    merged = dataclasses.replace(old, auth=auth, **{name: getattr(new, name) for name in RELOADED})
    return merged, kept


class Snapshots:
    """The app's generations (see the module): the current one, and the retired ones still
    running requests. ``table`` makes a config's dispatch table."""

    def __init__(self, table: Callable[[Config], dict[str, Endpoint]]) -> None:
        #: the config's dispatch table, and its admin API's endpoints (docs/spec.md §28)
        self._made = table
        self.current: Generation | None = None
        self._retired: list[Generation] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

    def _generation(self, runtime: Runtime) -> Generation:
        return Generation(runtime, *tables(self._made(runtime.config), runtime.config))

    async def start(self, config: Config) -> Generation:
        gen = self.current = self._generation(build_runtime(config))
        await gen.runtime.start()
        return gen

    async def listener(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app of the admin API's own listener (``[admin] listen``, docs/spec.md §28):
        the app's dispatch, on :meth:`Generation.listener_endpoint`. A WebSocket handshake is
        refused (never accepted); the server runs the lifespan on the app, not here."""
        if scope["type"] != "http":
            return
        gen = self.current
        if gen is None:  # not started (or stopping): only health answers
            return await endpoints.starting(scope, send)
        gen.active += 1
        try:
            await gen.listener_endpoint(scope)(gen.runtime, scope, receive, send)
        finally:
            gen.active -= 1
            if gen.retired and not gen.active:
                self.idle(gen)

    async def reload(self, config: Config | None = None) -> Config | None:
        """Read the config file again (or take ``config``) and serve it: the config now
        served, or None when the running one was kept (the error logged)."""
        async with self._lock:  # one reload at a time; a second SIGHUP waits its turn
            cur = self.current
            built = self._build(cur.runtime, config) if cur is not None else None
            if cur is None or built is None:
                return None
            runtime, kept = built
            if runtime.services is not None:  # a new issuer's keys, before it serves
                await runtime.services.key_sets.ready()
            return self._swap(cur, runtime, kept)

    def _build(self, old: Runtime, config: Config | None) -> tuple[Runtime, list[str]] | None:
        source = old.config.source
        try:
            if config is None:
                config = _read_again(source)
            merged, kept = merge(old.config, config)
            return build_runtime(merged, services=old.services, previous=old), kept
        except ConfigError as exc:
            self._failed(old, source, "; ".join(exc.errors))
        except Exception as exc:  # a snapshot that cannot be built: the running one stays
            log.exception("gateway: config reload: building the new snapshot failed")
            self._failed(old, source, str(exc) or type(exc).__name__)
        return None

    def _swap(self, cur: Generation, runtime: Runtime, kept: list[str]) -> Config:
        merged, source = runtime.config, runtime.config.source
        gen = self.current = self._generation(runtime)
        runtime.begin()
        self._retire(cur)
        _count(runtime, "ok")
        auth = merged.auth
        log.info(
            f"gateway: config reloaded from {source} (process {os.getpid()}): "
            f"{len(merged.backends)} backends, {len(merged.routes)} routes, "
            f"{len(auth.keys)} keys, {len(auth.jwt)} sign-in issuers, "
            f"{len(merged.mcp_servers)} MCP servers"
        )
        if kept:
            log.warning(
                f"gateway: config reload: {', '.join(kept)} changed in the file but only apply "
                "at a restart: their running values are kept"
            )
        return gen.runtime.config

    def _failed(self, rt: Runtime, source: str, why: str) -> None:
        _count(rt, "error")
        where = "" if why.startswith(source) else f"{source}: "
        log.error(
            f"gateway: config reload failed, the running config is kept "
            f"(process {os.getpid()}): {where}{why}"
        )

    def _retire(self, gen: Generation) -> None:
        gen.retired = True
        self._retired.append(gen)
        if not gen.active:
            self.idle(gen)

    def idle(self, gen: Generation) -> None:
        """A retired generation's last request is over: close what it alone held."""
        if gen in self._retired:
            self._retired.remove(gen)
            task = asyncio.get_running_loop().create_task(self._drop(gen))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _drop(self, gen: Generation) -> None:
        live = [g.runtime for g in (self.current, *self._retired) if g is not None]
        held = {id(b) for rt in live for b in rt.backends.values()}
        await gen.runtime.retire(held)

    async def aclose(self) -> None:
        """Shutdown: every retired generation, then the current one and the services."""
        for gen in list(self._retired):
            self._retired.remove(gen)
            await self._drop(gen)
        if self._closing:
            await asyncio.wait(self._closing, timeout=5.0)
        cur, self.current = self.current, None
        if cur is not None:
            await cur.runtime.aclose()


def _read_again(source: str) -> Config:
    """The config from where it came: a path, or the embedded default (``GATEWAY__*``
    overrides applied again, from the process's environment)."""
    if source == "<embedded default>":
        return load_config()
    if source.startswith("<"):
        raise ConfigError([f"{source}: a config given as text cannot be read again"])
    return load_config(source)


def _count(rt: Runtime, result: str) -> None:
    metrics = rt.telemetry.metrics
    if metrics is not None:
        metrics.reloads.inc((result,))


__all__ = ["AUTH_RELOADED", "RELOADED", "Generation", "Snapshots", "merge", "tables"]
