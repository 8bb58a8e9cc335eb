"""The shared-state plumbing: what every store kept in Redis is built on (docs/architecture.md,
"Redis never holds a request up").

- ``connect``: the one kind of Redis client the stores use, and which Redis the config names;
- ``cluster``: Redis Cluster, routed here through redis-py's public API;
- ``breaker``: the circuit breaker that stops calling a dead Redis;
- ``guard``: the timeout, the breaker and one error type per store, around every command, and
  :class:`~gateway.store.guard.GuardedRedis`, the base of a store kept in Redis;
- ``keyvalue``: a prefixed key-value map in Redis and its in-memory twin.

The response cache (gateway/cache/), the limits (gateway/budgets/), response ownership
(gateway/hops/ownership.py) and MCP sessions (gateway/mcp/sessions.py) are built on it.
"""
