"""Budgets: what a request may spend and what it cost (docs/spec.md §12, §20, §24).

- ``spend``: prices, what a request costs, its worst case, the budgets' calendar periods;
- ``limits``: rpm and tpm (GCRA), budgets, and the stores that count them (per process, Redis);
- ``reservations``: a request's reservation as a state machine, and its Redis scripts;
- ``backlog``: what Redis did not hear of while it was away, replayed when it answers.

The auth hop (gateway/hops/auth.py) asks the limits; telemetry reads a request's cost from
``spend``.
"""
