"""The built-in live view (docs/spec.md §18), one package.

- :mod:`gateway.live.recent`: the ring buffer of finished requests (a telemetry sink the
  runtime builds; it sits low in the import layers, beside telemetry);
- :mod:`gateway.live.sign_in`: the browser's sign-in: signed, expiring session tokens;
- :mod:`gateway.live.view`: the endpoints under ``[ui] path`` (the page in ``ui/``, the JSON
  API, the SSE feed, sign-in).

Nothing is imported here: the runtime imports the ring buffer, and the view imports the runtime.
"""
