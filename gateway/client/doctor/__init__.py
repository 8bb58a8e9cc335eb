"""``gateway doctor``: the slow-response checklist as one command (docs/spec.md §17).

It runs from the outside, against any OpenAI-compatible base URL (the gateway, a backend, a public
API), the checks an engineer runs when "the model is slow", and prints one row per check: name,
measured value, threshold, verdict (``ok`` | ``warn`` | ``fail`` | ``skip``), what was seen
(``detail``) and a one-line hint of what to do. One module per row, each saying how it measures:

- ``dns``, ``connect``, ``tls``: :mod:`.network`;
- ``http2`` (reuse), and the ``did you mean BASE/v1?`` hint: :mod:`.reuse`;
- ``idle`` (an idle connection ends with GOAWAY, not silently; ``--idle-wait``): :mod:`.idle_close`;
- ``ttfb``: :mod:`.ttfb`;
- ``encoding``: :mod:`.compression`;
- ``streaming``: :mod:`.stream_pacing`;
- ``proxy``: :mod:`.proxy_time`;
- ``cache``: :mod:`.cache_hit`.

:mod:`.checklist` runs them in that order with one :mod:`.timed_client` for every row after the
network ones; :mod:`.report` holds the rows and renders them; :mod:`.thresholds` the limits.

Requests that measure the upstream path carry ``Cache-Control: no-store`` and a unique prompt, so
no cache replay is judged as the model's speed; only the cache row repeats a request.

The gateway's request path never imports this package (nor anything in :mod:`gateway.client`).
"""

from __future__ import annotations

from gateway.client.doctor.checklist import DoctorError, Options, run
from gateway.client.doctor.proxy_time import server_timing
from gateway.client.doctor.report import Check, Report
from gateway.client.doctor.stream_pacing import StreamShape, stream_shape
from gateway.client.doctor.thresholds import DEFAULT_THRESHOLDS, parse_thresholds

__all__ = [
    "DEFAULT_THRESHOLDS",
    "Check",
    "DoctorError",
    "Options",
    "Report",
    "StreamShape",
    "parse_thresholds",
    "run",
    "server_timing",
    "stream_shape",
]
