"""The server: the process that serves the ASGI app, and the protocols of its connections.

No third-party server runs the gateway. From the top (each module imports only those below it,
``.importlinter``):

- :mod:`.worker`: one ``--workers`` process (``python -m gateway.server.worker``);
- :mod:`.process`: bind, the lifespan, the serving loop, signals, the drain, ``serve``;
- :mod:`.supervisor`: ``workers > 1``, the parent that starts, watches and stops the workers;
- :mod:`.connections`: the protocol an accepted connection is served by, chosen once (HTTP/1.1;
  with TLS by ALPN, with ``h2c`` by the preface, HTTP/2);
- :mod:`.http1`: the HTTP/1.1 connection (keep-alive, pipelining, the WebSocket hand-off), with
  :mod:`.http1_guards` (the head's caps, the client timeouts, the lingering close) and
  :mod:`.http1_exchange` (one request's ASGI ``receive``/``send``, the answer's writer);
- :mod:`.websocket`: the server's side of a WebSocket upgrade (the handshake, ASGI), with
  :mod:`.websocket_connection` (frames, the close, keepalive, back-pressure);
- :mod:`.http2`: the HTTP/2 connection on ``h2`` (each stream one ASGI request; GOAWAY), with
  :mod:`.http2_guards` (the HTTP/2 attacks' bounds, the timeouts) and :mod:`.http2_stream` (one
  stream's ASGI ``receive``/``send``, flow control as backpressure);
- :mod:`.intake`: the rules a request head must meet before the app sees it (docs/spec.md §25);
- :mod:`.state`: what the connections of one process share (:class:`.state.ServerState`) and
  the client guards' limits, built from ``[server]``;
- :mod:`.tls`: the TLS context of ``[server.tls]`` (ALPN, mTLS, the re-read on SIGHUP).

Nothing is imported here.
"""
