"""The peers benchmark: this gateway beside other LLM proxies, in one run (docs/spec.md §15).

    python loadtests/peers [--duration 10] [--only NAME ...] [--cores PROXY_CORE,LOAD_CORE]

Each peer is installed on first use into its own environment under a cache directory
(``loadtests/.peers/`` by default, gitignored), pointed at the same nginx upstream as the gateway
with the same model name, checked (a JSON chat completion and a stream) and measured with
``loadtests/overhead.py``'s wrk harness: req/s at c=32, added p50 at c=1, and the CPU per request
of all the proxy's processes. See loadtests/README.md.
"""
