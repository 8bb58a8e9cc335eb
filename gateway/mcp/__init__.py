"""MCP through the gateway (docs/spec.md §23): ``/mcp/{server}`` relays one upstream MCP server
(Streamable HTTP), ``/mcp`` serves every server a key may use behind one endpoint. The
agents' tool calls get the same keys, limits, traces and live view as their model calls.

Modules: ``service`` (the endpoints), ``relay`` (``/mcp/{server}``), ``aggregate`` (``/mcp``),
``exchange`` (one upstream exchange and its answer relayed), ``hub`` (what they share),
``access`` (who may use which tool, Origin checks), ``sessions`` (session ids, in Redis when
configured), ``upstream`` (a server's transports and credentials).
"""
