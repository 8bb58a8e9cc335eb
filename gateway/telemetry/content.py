"""Prompts and completions on spans, only as ``[tracing] capture_content`` says (docs/spec.md §7).

``none`` (the default): nothing of them leaves the process. ``metadata``: their shape only —
roles, part types, tool names, finish reasons and each text's size in bytes, never a character
of text. ``full``: the text too, after the ``redact`` patterns replaced their matches with
``[REDACTED]``, cut to ``capture_max_bytes`` bytes of text per attribute.

The attributes follow the GenAI conventions' JSON schemas (``gen-ai-input-messages.json``,
``-output-messages.json``, ``-system-instructions.json``, ``-tool-definitions.json``), recorded
as JSON strings: ``gen_ai.input.messages`` (the chat history as sent, in order),
``gen_ai.system_instructions`` (Anthropic's ``system``, the Responses API's ``instructions``:
instructions given apart from the history), ``gen_ai.tool.definitions`` (each tool's type and
name only: the conventions advise against the optional properties by default) and
``gen_ai.output.messages`` (the answer's text, assembled from the relayed events for a
stream). In ``metadata`` mode a text part is ``{"type": "text", "size": N}`` (a ``GenericPart``
of the schema). OpenInference's names (``llm.input_messages.{i}.message.role`` / ``.content``,
``input.value``, ``output.value``) are written from the same, already redacted and capped, text.

What it costs is bounded whatever the body holds: every text is cut to what the budget still
allows (plus a small margin, so a pattern spanning the cut still matches) *before* the patterns
run, and every message and part takes a few bytes of the budget, so a body of a million empty
messages stops at the cap like one long text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

import orjson

from gateway.config import TracingConfig
from gateway.context import RequestContext

REDACTED: Final = "[REDACTED]"
#: characters read past the budget so a pattern that straddles the cut still matches
_MARGIN = 256
#: what a message or a part takes from the budget besides its text (its JSON framing)
_OVERHEAD = 16


class _Budget:
    """The bytes of text one attribute may still carry."""

    __slots__ = ("left", "truncated")

    def __init__(self, size: int) -> None:
        self.left = size
        self.truncated = False

    def take(self, n: int) -> bool:
        """Spend ``n`` bytes of framing; False once the budget is spent (the rest is left out)."""
        if self.left <= 0:
            self.truncated = True
            return False
        self.left -= n
        return True


class ContentPolicy:
    """``capture_content``, ``capture_max_bytes`` and ``redact``, built once at startup."""

    __slots__ = ("_pattern", "full", "max_bytes", "mode", "openinference")

    def __init__(
        self,
        mode: str = "none",
        max_bytes: int = 16384,
        redact: Sequence[str] = (),
        openinference: bool = False,
    ) -> None:
        self.mode = mode
        self.full = mode == "full"
        self.max_bytes = max_bytes
        self.openinference = openinference
        #: one alternation of every pattern: one pass over the text, however many there are
        self._pattern = re.compile("|".join(f"(?:{p})" for p in redact)) if redact else None

    @classmethod
    def of(cls, cfg: TracingConfig) -> ContentPolicy:
        return cls(
            cfg.capture_content,
            cfg.capture_max_bytes,
            cfg.redact,
            cfg.conventions == "openinference",
        )

    @property
    def capturing(self) -> bool:
        return self.mode != "none"

    def redact(self, text: str) -> str:
        pattern = self._pattern
        return text if pattern is None else pattern.sub(REDACTED, text)

    def text(self, value: str, budget: _Budget) -> dict[str, Any]:
        """A text part: its content (full) or its size (metadata)."""
        if not self.full:
            budget.take(_OVERHEAD)
            return {"type": "text", "size": len(value.encode("utf-8", "surrogatepass"))}
        return {"type": "text", "content": self.cut(value, budget)}

    def cut(self, value: str, budget: _Budget) -> str:
        """``value`` redacted and cut to what ``budget`` still allows (full mode)."""
        if not budget.take(_OVERHEAD) or budget.left <= 0:
            budget.truncated = True
            return ""
        window = value[: budget.left + _MARGIN]
        text = self.redact(window)
        data = text.encode("utf-8", "surrogatepass")
        if len(data) > budget.left:
            text = data[: budget.left].decode("utf-8", "ignore")
            data = text.encode("utf-8", "surrogatepass")
            budget.truncated = True
        elif len(window) < len(value):
            budget.truncated = True
        budget.left -= len(data)
        return text

    def attributes(self, ctx: RequestContext) -> tuple[dict[str, str], bool]:
        """The content attributes of the request's model call (JSON strings), and whether any
        was cut to the cap."""
        call = ctx.call
        payload: dict[str, Any] = call.payload if call is not None else {}
        out: dict[str, str] = {}
        truncated = False
        budget = _Budget(self.max_bytes)
        system = _system_parts(self, payload, budget)
        if system:
            out["gen_ai.system_instructions"] = _json(system)
        truncated |= budget.truncated
        budget = _Budget(self.max_bytes)
        messages = _input_messages(self, payload, budget)
        if messages:
            out["gen_ai.input.messages"] = _json(messages)
        truncated |= budget.truncated
        tools = _tool_definitions(payload)
        if tools:
            out["gen_ai.tool.definitions"] = _json(tools)
        budget = _Budget(self.max_bytes)
        output = _output_messages(self, ctx, budget)
        if output:
            out["gen_ai.output.messages"] = _json(output)
        truncated |= budget.truncated
        if self.openinference:
            out.update(_openinference(self, system, messages, output))
        return out, truncated


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _system_parts(policy: ContentPolicy, payload: dict[str, Any], budget: _Budget) -> list[Any]:
    """Anthropic's ``system`` and the Responses API's ``instructions``."""
    system = payload.get("system", payload.get("instructions"))
    if isinstance(system, str):
        return [policy.text(system, budget)]
    if isinstance(system, list):
        return _parts(policy, system, budget)
    return []


def _input_messages(policy: ContentPolicy, payload: dict[str, Any], budget: _Budget) -> list[Any]:
    messages = payload.get("messages")
    if isinstance(messages, list):  # chat completions, Anthropic messages
        return _messages(policy, messages, budget)
    value = payload.get("input", payload.get("prompt"))
    if isinstance(value, str):  # a completion's prompt, a Responses input, an embedding
        return [{"role": "user", "parts": [policy.text(value, budget)]}]
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return [{"role": "user", "parts": _parts(policy, value, budget)}]
        return _messages(policy, value, budget)  # Responses input items
    return []


def _messages(policy: ContentPolicy, items: Iterable[Any], budget: _Budget) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if not budget.take(_OVERHEAD):
            break
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind in ("function_call", "custom_tool_call"):  # a Responses item of the assistant
            part = _tool_call(policy, item.get("call_id"), item.get("name"), item, budget)
            out.append({"role": "assistant", "parts": [part]})
            continue
        if isinstance(kind, str) and kind.endswith("_call_output"):
            part = _tool_result(policy, item.get("call_id"), item.get("output"), budget)
            out.append({"role": "tool", "parts": [part]})
            continue
        role = item.get("role")
        parts = _content(policy, item.get("content"), budget)
        for call in item.get("tool_calls") or ():  # chat completions' assistant tool calls
            if isinstance(call, dict):
                fn = call.get("function")
                fn = fn if isinstance(fn, dict) else {}
                parts.append(_tool_call(policy, call.get("id"), fn.get("name"), fn, budget))
        if role == "tool":  # chat completions' tool result
            parts = [_tool_result(policy, item.get("tool_call_id"), item.get("content"), budget)]
        out.append({"role": role if isinstance(role, str) else "user", "parts": parts})
    return out


def _content(policy: ContentPolicy, content: Any, budget: _Budget) -> list[Any]:
    if isinstance(content, str):
        return [policy.text(content, budget)]
    if isinstance(content, list):
        return _parts(policy, content, budget)
    return []


def _parts(policy: ContentPolicy, parts: Iterable[Any], budget: _Budget) -> list[Any]:
    out: list[Any] = []
    for part in parts:
        if not budget.take(_OVERHEAD):
            break
        if isinstance(part, str):
            out.append(policy.text(part, budget))
            continue
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        text = part.get("text")
        if isinstance(text, str) and kind in ("text", "input_text", "output_text"):
            out.append(policy.text(text, budget))
        elif kind == "tool_use":  # Anthropic
            out.append(_tool_call(policy, part.get("id"), part.get("name"), part, budget))
        elif kind == "tool_result":
            out.append(_tool_result(policy, part.get("tool_use_id"), part.get("content"), budget))
        else:  # images, audio, files, documents: the type only, never their data
            out.append({"type": kind if isinstance(kind, str) else "unknown"})
    return out


def _tool_call(
    policy: ContentPolicy, call_id: Any, name: Any, holder: dict[str, Any], budget: _Budget
) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "tool_call", "name": name if isinstance(name, str) else ""}
    if isinstance(call_id, str):
        part["id"] = call_id
    if policy.full:
        arguments = holder.get("arguments", holder.get("input"))
        if arguments is not None:
            text = arguments if isinstance(arguments, str) else _json(arguments)
            part["arguments"] = policy.cut(text, budget)
    return part


def _tool_result(
    policy: ContentPolicy, call_id: Any, result: Any, budget: _Budget
) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "tool_call_response"}
    if isinstance(call_id, str):
        part["id"] = call_id
    text = result if isinstance(result, str) else _json(result) if result is not None else ""
    if policy.full:
        part["response"] = policy.cut(text, budget)
    else:
        budget.take(_OVERHEAD)
        part["size"] = len(text.encode("utf-8", "surrogatepass"))
    return part


def _tool_definitions(payload: dict[str, Any]) -> list[Any]:
    """Each tool's type and name (chat completions nest them under ``function``)."""
    tools = payload.get("tools")
    out: list[Any] = []
    for tool in tools[:128] if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function")
        name = (fn if isinstance(fn, dict) else tool).get("name")
        kind = tool.get("type")
        entry = {"type": kind if isinstance(kind, str) else "function"}
        if isinstance(name, str):
            entry["name"] = name
        out.append(entry)
    return out


def _output_messages(policy: ContentPolicy, ctx: RequestContext, budget: _Budget) -> list[Any]:
    """The answer as one assistant message: its text as relayed (JSON or stream events)."""
    answer = ctx.answer
    captured = answer.captured
    if captured is None or (not captured and not answer.finish_reasons):
        return []
    text = "".join(captured)
    parts = [policy.text(text, budget)] if text else []
    reasons = answer.finish_reasons
    return [{"role": "assistant", "parts": parts, "finish_reason": reasons[0] if reasons else ""}]


def _openinference(
    policy: ContentPolicy, system: list[Any], messages: list[Any], output: list[Any]
) -> dict[str, str]:
    """OpenInference's flattened messages and input/output values, from the captured parts
    (already redacted and capped)."""
    out: dict[str, str] = {}
    listed = ([{"role": "system", "parts": system}] if system else []) + messages
    for i, message in enumerate(listed):
        out[f"llm.input_messages.{i}.message.role"] = str(message.get("role"))
        if policy.full:
            out[f"llm.input_messages.{i}.message.content"] = _joined(message["parts"])
    for i, message in enumerate(output):
        out[f"llm.output_messages.{i}.message.role"] = "assistant"
        if policy.full:
            out[f"llm.output_messages.{i}.message.content"] = _joined(message["parts"])
    if policy.full:
        if listed:
            out["input.value"] = _json(listed)
            out["input.mime_type"] = "application/json"
        if output:
            out["output.value"] = _joined(output[0]["parts"])
            out["output.mime_type"] = "text/plain"
    return out


def _joined(parts: Sequence[Any]) -> str:
    return "".join(p.get("content", "") for p in parts if isinstance(p, dict))


__all__ = ["REDACTED", "ContentPolicy"]
