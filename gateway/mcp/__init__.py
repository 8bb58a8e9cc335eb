"""MCP through the gateway (docs/spec.md §23): ``/mcp/{server}`` relays one upstream MCP server
(Streamable HTTP), ``/mcp`` serves every server a key may use behind one endpoint. The
agents' tool calls get the same keys, limits, traces and live view as their model calls.

Modules: ``endpoint`` (the endpoints), ``forward`` (``/mcp/{server}``: one server, forwarded),
``aggregate`` (``/mcp``), ``exchange`` (one upstream exchange and its answer relayed), ``hub``
(what they share), ``access`` (who may use which tool, Origin checks), ``sessions`` (MCP
session ids, in Redis when configured), ``servers`` (an upstream server's transports and
credentials).
"""
