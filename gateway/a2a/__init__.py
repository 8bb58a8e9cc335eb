"""A2A through the gateway (docs/spec.md §30): agents calling agents with the same keys, limits,
traces and live view as their model calls and tool calls. ``/a2a/{agent}`` relays one
``[[agents]]`` entry (JSON-RPC and HTTP+JSON bindings, A2A 1.0 and the 0.3 names), its card is
served rewritten to point at the gateway, and ``/a2a`` lists the agents a key may call.

Modules: ``endpoint`` (the endpoints, auth, metrics), ``calls`` (a call read and checked),
``relay`` (one exchange and its answer, JSON or SSE), ``binding`` (task and context ids bound
to tenants), ``access`` (who may call which agent), ``agents`` (an agent's transport,
credentials and card), ``card`` (which interfaces are used, the card as served), ``rest`` (the
HTTP+JSON paths), ``protocol`` (methods, ids, answer facts, errors).
"""
