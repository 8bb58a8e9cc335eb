"""What a request asks the mock beyond text: a tool call, a JSON answer, tool results to report.

One :class:`Turn` per request, read from each API's own fields, so agent frameworks' tool loops
and structured outputs run on the mock:

- the conversation ends with tool results (chat: ``tool`` messages; Responses:
  ``function_call_output`` items; Messages: ``tool_result`` blocks) → the answer mentions them
  (``results``), as JSON if a schema is asked for;
- else the request offers function tools and does not forbid them (``tool_choice`` ``none``)
  → ``call``: the tool ``tool_choice`` names, else the first MCP tool (named ``mcp__…`` as
  Claude Code names them, or in a Responses ``namespace`` named ``mcp__…`` as Codex offers
  them: an agent CLI pointed at the gateway calls a tool of its MCP servers, not its shell),
  else the first one, with its JSON-schema parameters;
- else a JSON answer is asked for (chat ``response_format``, Responses ``text.format``,
  Messages ``output_config.format`` / ``output_format``) → ``schema``.

A ``tool_choice`` naming a tool the request does not offer raises :class:`ValueError` (the
endpoint answers 400).

>>> tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
>>> chat_turn({"messages": [{"role": "user", "content": "1+1?"}], "tools": tools}).call
('add', {'type': 'object'})
>>> done = [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "add"}}]},
...         {"role": "tool", "tool_call_id": "c1", "content": "2"}]
>>> chat_turn({"messages": done, "tools": tools}).results
'The add tool returned: 2'
>>> mcp = {"type": "function", "function": {"name": "mcp__gw__echo", "parameters": {}}}
>>> chat_turn({"messages": [{"role": "user", "content": "hi"}], "tools": [*tools, mcp]}).call[0]
'mcp__gw__echo'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

#: the schema a "JSON object" answer (chat ``json_object``) fills
JSON_OBJECT = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
}
#: the parameters of a tool that declares none
_NO_PARAMETERS = {"type": "object", "properties": {}}
#: how agent CLIs name their MCP servers' tools (Claude Code) or tool namespaces (Codex)
MCP_PREFIX = "mcp__"


@dataclass(frozen=True, slots=True)
class Turn:
    #: (tool name, its parameters' JSON schema) to call
    call: tuple[str, Any] | None = None
    #: what the tool results said, to mention in the answer
    results: str | None = None
    #: the JSON schema the answer must match (None: plain text)
    schema: Any = None
    #: the Responses ``namespace`` tool the called function belongs to
    namespace: str | None = None


def mention(results: list[tuple[str | None, Any]]) -> str:
    """One sentence per (tool name, result)."""
    said = []
    for name, result in results:
        text = _text_of(result).strip() or "nothing"
        said.append(f"The {name} tool returned: {text}" if name else f"The tool returned: {text}")
    return " ".join(said)


def _text_of(content: Any) -> str:
    """A result's text: a string, the text parts of a list of parts, else its JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return " ".join(str(p["text"]) for p in content if isinstance(p.get("text"), str))
    return orjson.dumps(content).decode() if content is not None else ""


def _is_mcp(name: str | None) -> bool:
    return name is not None and name.startswith(MCP_PREFIX)


def _pick(tools: list[tuple[str, Any]], named: str | None) -> tuple[str, Any]:
    if named is None:
        return next((t for t in tools if _is_mcp(t[0])), tools[0])
    for tool in tools:
        if tool[0] == named:
            return tool
    raise _not_offered(named)


def _not_offered(named: str) -> ValueError:
    return ValueError(f"tool_choice names {named!r}, which is not one of the request's tools")


def _format_schema(fmt: Any) -> Any:
    """``{"type": "json_schema", "json_schema"|…: {"schema": …}}`` / ``json_object`` → a schema."""
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return JSON_OBJECT
    if fmt.get("type") != "json_schema":
        return None
    holder = fmt.get("json_schema", fmt)  # chat nests it; Responses and Messages do not
    schema = holder.get("schema") if isinstance(holder, dict) else None
    return schema if isinstance(schema, dict) and schema else JSON_OBJECT


# ---------------------------------------------------------------- chat/completions


def chat_turn(payload: dict[str, Any]) -> Turn | None:
    """The turn of a chat/completions request (``messages`` already checked non-empty)."""
    messages = payload["messages"]
    schema = _format_schema(payload.get("response_format"))
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") == "tool":
        return Turn(results=mention(_chat_results(messages)), schema=schema)
    tools = [
        (t["function"]["name"], t["function"].get("parameters") or _NO_PARAMETERS)
        for t in payload.get("tools") or ()
        if isinstance(t, dict)
        and t.get("type", "function") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]
    choice = payload.get("tool_choice")
    if tools and choice != "none":
        named = None
        if isinstance(choice, dict) and choice.get("type") == "function":
            function = choice.get("function")
            named = str(function.get("name")) if isinstance(function, dict) else ""
        return Turn(call=_pick(tools, named))
    return Turn(schema=schema) if schema is not None else None


def _chat_results(messages: list[Any]) -> list[tuple[str | None, Any]]:
    """The trailing ``tool`` messages, each with the name its assistant call gave it."""
    names: dict[Any, str] = {}
    results: list[tuple[Any, Any]] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool":
            results.append((m.get("tool_call_id"), m.get("content")))
            continue
        results = []
        for call in m.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                names[call.get("id")] = function["name"]
    return [(names.get(ident), content) for ident, content in results]


# ---------------------------------------------------------------- Responses API


def responses_turn(payload: dict[str, Any]) -> Turn | None:
    """The turn of a ``/responses`` request (``input`` already checked)."""
    raw = payload["input"]
    text = payload.get("text")
    schema = _format_schema(text.get("format")) if isinstance(text, dict) else None
    if isinstance(raw, list) and raw[-1].get("type") == "function_call_output":
        return Turn(results=mention(_responses_results(raw)), schema=schema)
    tools = _responses_functions(payload.get("tools") or (), None)
    choice = payload.get("tool_choice")
    if tools and choice != "none":
        if isinstance(choice, dict) and choice.get("type") == "function":
            named = str(choice.get("name"))
            picked = [t for t in tools if t[0] == named]
            if not picked:
                raise _not_offered(named)
        else:
            picked = [t for t in tools if _is_mcp(t[0]) or _is_mcp(t[2])] or tools
        name, parameters, namespace = picked[0]
        return Turn(call=(name, parameters), namespace=namespace)
    return Turn(schema=schema) if schema is not None else None


def _responses_functions(tools: Any, namespace: str | None) -> list[tuple[str, Any, str | None]]:
    """(name, parameters, namespace) of the function tools, those of ``namespace`` tools too."""
    found: list[tuple[str, Any, str | None]] = []
    for t in tools:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            continue
        if t.get("type") == "function":
            found.append((t["name"], t.get("parameters") or _NO_PARAMETERS, namespace))
        elif t.get("type") == "namespace" and namespace is None:  # (not nested twice)
            inner = t.get("tools")
            found.extend(_responses_functions(inner if isinstance(inner, list) else (), t["name"]))
    return found


def _responses_results(items: list[dict[str, Any]]) -> list[tuple[str | None, Any]]:
    names = {
        i.get("call_id"): i["name"]
        for i in items
        if i.get("type") == "function_call" and isinstance(i.get("name"), str)
    }
    trailing: list[dict[str, Any]] = []
    for item in reversed(items):
        if item.get("type") != "function_call_output":
            break
        trailing.append(item)
    return [(names.get(i.get("call_id")), i.get("output")) for i in reversed(trailing)]


# ---------------------------------------------------------------- Messages API


def messages_turn(payload: dict[str, Any]) -> Turn | None:
    """The turn of a ``/messages`` request (``messages`` already checked)."""
    messages = payload["messages"]
    config = payload.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else payload.get("output_format")
    schema = _format_schema(fmt)
    results = _tool_results(messages)
    if results:
        return Turn(results=mention(results), schema=schema)
    tools = [
        (t["name"], t.get("input_schema") or _NO_PARAMETERS)
        for t in payload.get("tools") or ()
        if isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("input_schema"), dict)  # server tools (web search, ...) have none
    ]
    choice = payload.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if tools and kind != "none":
        named = str(choice.get("name")) if isinstance(choice, dict) and kind == "tool" else None
        return Turn(call=_pick(tools, named))
    return Turn(schema=schema) if schema is not None else None


def _tool_results(messages: list[dict[str, Any]]) -> list[tuple[str | None, Any]]:
    """The ``tool_result`` blocks of the last (user) message, named by the calls before it."""
    blocks = messages[-1]["content"]
    if messages[-1]["role"] != "user" or not isinstance(blocks, list):
        return []
    names = {}
    if len(messages) > 1 and isinstance(messages[-2]["content"], list):
        names = {
            b.get("id"): b["name"]
            for b in messages[-2]["content"]
            if isinstance(b, dict)
            and b.get("type") == "tool_use"
            and isinstance(b.get("name"), str)
        }
    return [
        (names.get(b.get("tool_use_id")), b.get("content"))
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
