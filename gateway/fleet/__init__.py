"""The fleet: which backend a request goes to, and what the gateway knows of each backend.

- ``health``: the retry budget and each route's plan for a request (passive health, saturation,
  affinity, then the strategy), what the model calls and realtime ask;
- ``ejection``: passive health -- a backend, or a (backend, model) pair, out of rotation after
  failures, and back after a probe;
- ``balance``: the strategies that order a route's backends (ordered, weighted,
  least_outstanding, least_loaded);
- ``scorer``: each backend's load now, from its last scrape and what was sent since;
- ``load``: the scrapers of the model servers' metrics (vLLM, SGLang), off the request path;
- ``affinity``: rendezvous hashing of a session or a prompt prefix to a backend.
"""
