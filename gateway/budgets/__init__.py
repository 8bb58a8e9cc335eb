"""Budgets: what a request may spend and what it cost (docs/spec.md §12, §20, §24).

- ``spend``: prices, what a request costs, its worst case, the budgets' calendar periods;
- ``limits``: rpm and tpm (GCRA), budgets, and :class:`~gateway.budgets.limits.Limits`, what
  every store of them answers; ``memory_limits`` counts them in this process, ``redis_limits``
  in Redis, shared by the replicas;
- ``reservations``: a request's reservation as a state machine (reserved, settled, expired);
  ``scripts``: that table and the buckets in Lua, applied atomically by Redis;
- ``backlog``: what Redis did not hear of while it was away, replayed when it answers;
- ``metering``: a batch's worst case, and what its results cost.

The auth hop (gateway/hops/auth.py) asks the limits; telemetry reads a request's cost from
``spend``.
"""
