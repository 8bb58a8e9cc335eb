"""Realtime over WebSocket: ``GET /v1/realtime`` sessions relayed to a model (docs/spec.md §19).

- :mod:`.session`: one session end to end (the hops before the upgrade, accept, relay, telemetry);
- :mod:`.handshake`: the upstream handshake, the attempt loop's connect (:mod:`gateway.attempts`:
  attempts, retries and fallback);
- :mod:`.upstream_socket`: the upstream socket (``websockets``' client, or the in-process mock);
- :mod:`.message_relay`: the direct path, the two pumps and the one close path, the limits;
- :mod:`.events`: what the relay reads in the events it passes on (model responses);
- :mod:`.spans`: the session's spans;
- :mod:`.server_protocol`: the client's WebSocket hop, our asyncio protocol on ``websockets``'
  sans-I/O one, with the socket stamps the Timeline needs and the relay's direct path.

Nothing is imported here: ``gateway.server`` imports the protocol alone.
"""
