"""Realtime over WebSocket: ``GET /v1/realtime`` sessions relayed to a model (docs/spec.md §19).

- :mod:`.upgrade`: what the app does with a WebSocket scope (``/v1/realtime`` to the sessions,
  any other handshake refused as HTTP);
- :mod:`.session`: one session end to end (the hops before the upgrade, accept, relay, telemetry);
- :mod:`.handshake`: the upstream handshake, the attempt loop's connect (:mod:`gateway.attempts`:
  attempts, retries and fallback);
- :mod:`.upstream_socket`: the upstream socket (``websockets``' client, or the in-process mock);
- :mod:`.message_relay`: the direct path, the two pumps and the one close path, the limits;
- :mod:`.events`: what the relay reads in the events it passes on (model responses);
- :mod:`.spans`: the session's spans;
- :mod:`.client_end`: the server's end of the client connection as a session uses it (the relay's
  direct path, the drain, the socket stamps); the client's WebSocket hop itself is the server's,
  :mod:`gateway.server.websocket`.

Nothing is imported here: the server imports :mod:`.client_end` and :mod:`.frames` alone.
"""
