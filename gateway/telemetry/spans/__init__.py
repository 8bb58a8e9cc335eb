"""The span tree of one finished request, written from its Timeline (docs/spec.md §7).

One builder per span kind: edge hops (reconstructed from headers), ``hop intake``, ``hop auth``,
``hop router`` with its ``cache lookup`` child, ``cache store``, one CLIENT span per upstream
attempt, and the SERVER root. Runs once per sampled request on the event loop, after the
response went out; it uses the memoised pieces of :mod:`gateway.telemetry.otlp` so only times,
ids and numbers are encoded per request.

- :mod:`~gateway.telemetry.spans.tree`: what every span of a request shares, and the memoised
  attribute blocks both writers use;
- :mod:`~gateway.telemetry.spans.builders`: one builder per span kind, for any request
  (:func:`build_spans`);
- :mod:`~gateway.telemetry.spans.framed`: the common request's tree written framed in one pass
  (:func:`build_framed`), byte for byte what the builders and ``otlp.frame_spans`` write;
- :mod:`~gateway.telemetry.spans.route_names`: the bounded ``http.route`` of a path.
"""

from __future__ import annotations

from gateway.telemetry.spans.builders import build_spans
from gateway.telemetry.spans.framed import build_framed
from gateway.telemetry.spans.route_names import route_template
from gateway.telemetry.spans.tree import EdgeHop

__all__ = ["EdgeHop", "build_framed", "build_spans", "route_template"]
