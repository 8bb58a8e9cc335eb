"""What the gateway reads of A2A messages (A2A 1.0 and the 0.3 names the SDKs' compatibility
mode sends; docs/spec.md §30): the methods and what each one names, the ids a request names,
the facts of an answer (task, context, state, whether a stream is over), and the errors the
gateway answers with in each binding.

JSON field names are A2A's ProtoJSON camelCase (A2A §5.5). 1.0 wraps a send's or a stream
event's payload (``{"task": …}``, ``{"statusUpdate": …}``); 0.3 sends it bare with a ``kind``.
States are ``TASK_STATE_COMPLETED`` in 1.0 and ``completed`` in 0.3; both read as ``completed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

#: JSON-RPC 2.0 and A2A's own codes (A2A §5.4)
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
INTERNAL_ERROR = -32603
TASK_NOT_FOUND, PUSH_NOT_SUPPORTED, EXTENDED_CARD_NOT_CONFIGURED = -32001, -32003, -32007
#: A2A error -> (HTTP status, google.rpc status, ErrorInfo reason) of the HTTP+JSON binding
_REST: dict[int, tuple[int, str, str]] = {
    PARSE_ERROR: (400, "INVALID_ARGUMENT", "INVALID_REQUEST"),
    INVALID_REQUEST: (400, "INVALID_ARGUMENT", "INVALID_REQUEST"),
    METHOD_NOT_FOUND: (404, "NOT_FOUND", "METHOD_NOT_FOUND"),
    INVALID_PARAMS: (400, "INVALID_ARGUMENT", "INVALID_PARAMS"),
    INTERNAL_ERROR: (502, "UNAVAILABLE", "INTERNAL_ERROR"),
    TASK_NOT_FOUND: (404, "NOT_FOUND", "TASK_NOT_FOUND"),
    PUSH_NOT_SUPPORTED: (400, "FAILED_PRECONDITION", "PUSH_NOTIFICATION_NOT_SUPPORTED"),
    EXTENDED_CARD_NOT_CONFIGURED: (
        400,
        "FAILED_PRECONDITION",
        "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
    ),
}
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
_DOMAIN = "a2a-protocol.org"


@dataclass(frozen=True, slots=True)
class Method:
    """One A2A operation as one binding and version name it."""

    #: what the gateway does with it: send, stream, get, cancel, subscribe, list, push, card
    kind: str
    #: "1.0" or "0.3": which of the agent's interfaces serves it
    version: str

    @property
    def streams(self) -> bool:
        return self.kind in ("stream", "subscribe")

    @property
    def names_task(self) -> bool:
        """Its params' ``id`` is a task id (get, cancel, subscribe)."""
        return self.kind in ("get", "cancel", "subscribe")


def _table() -> dict[str, Method]:
    one = {
        "SendMessage": "send", "SendStreamingMessage": "stream", "GetTask": "get",
        "CancelTask": "cancel", "SubscribeToTask": "subscribe", "ListTasks": "list",
        "CreateTaskPushNotificationConfig": "push", "GetTaskPushNotificationConfig": "push",
        "ListTaskPushNotificationConfigs": "push", "DeleteTaskPushNotificationConfig": "push",
        "GetExtendedAgentCard": "card",
    }  # fmt: skip
    legacy = {
        "message/send": "send", "message/stream": "stream", "tasks/get": "get",
        "tasks/cancel": "cancel", "tasks/resubscribe": "subscribe", "tasks/list": "list",
        "tasks/pushNotificationConfig/set": "push", "tasks/pushNotificationConfig/get": "push",
        "tasks/pushNotificationConfig/list": "push", "tasks/pushNotificationConfig/delete": "push",
        "agent/getAuthenticatedExtendedCard": "card",
    }  # fmt: skip
    table = {name: Method(kind, "1.0") for name, kind in one.items()}
    table.update({name: Method(kind, "0.3") for name, kind in legacy.items()})
    return table


#: every JSON-RPC method the gateway knows; any other is -32601, never forwarded (the gateway
#: could not tell which ids it names)
METHODS = _table()
#: states after which a task takes no more messages, or waits for the client (A2A §4.1.3):
#: a stream ends there
_FINAL = frozenset(
    {"completed", "failed", "canceled", "rejected", "input_required", "auth_required"}
)


class A2aRefused(Exception):
    """A request refused with an error of its binding (HTTP ``status``), never forwarded."""

    def __init__(self, status: int, body: bytes, label: str, code: str | None = None) -> None:
        super().__init__(label)
        self.status, self.body, self.label = status, body, label
        #: the error's A2A code (the metrics' status is ``label``; the log's error is this)
        self.code = code or label


def rpc_error(rid: Any, code: int, message: str) -> bytes:
    """A JSON-RPC error answer with A2A's ErrorInfo detail (as the SDKs read it)."""
    reason = _REST.get(code, (500, "INTERNAL", "INTERNAL_ERROR"))[2]
    data = [{"@type": _ERROR_INFO, "reason": reason, "domain": _DOMAIN, "metadata": {}}]
    error = {"code": code, "message": message, "data": data}
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": error})


def rest_error(code: int, message: str) -> tuple[int, bytes]:
    """The HTTP+JSON binding's error for A2A ``code``: (HTTP status, body; A2A §11.6)."""
    status, name, reason = _REST.get(code, (500, "INTERNAL", "INTERNAL_ERROR"))
    info = {"@type": _ERROR_INFO, "reason": reason, "domain": _DOMAIN, "metadata": {}}
    body = {"error": {"code": status, "status": name, "message": message, "details": [info]}}
    return status, orjson.dumps(body)


def refusal(rest: bool, rid: Any, code: int, message: str, label: str) -> A2aRefused:
    """A refusal in the request's binding: JSON-RPC answers 200 with the error (as agents
    do), HTTP+JSON answers the error's status."""
    if rest:
        status, body = rest_error(code, message)
        return A2aRefused(status, body, label, str(code))
    return A2aRefused(200, rpc_error(rid, code, message), label, str(code))


def parse_rpc(body: bytes) -> dict[str, Any]:
    """One JSON-RPC 2.0 request (a batch, a notification or a response is refused: A2A sends
    none of them to an agent)."""
    try:
        msg = orjson.loads(body)
    except orjson.JSONDecodeError:
        body = rpc_error(None, PARSE_ERROR, "the body is not JSON")
        raise A2aRefused(400, body, "rejected") from None
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        text = "not a JSON-RPC 2.0 request (batches are not supported)"
        raise A2aRefused(400, rpc_error(None, INVALID_REQUEST, text), "rejected")
    rid = msg.get("id")
    if not (type(rid) is str or type(rid) is int) or not isinstance(msg.get("method"), str):
        text = "a JSON-RPC request needs a string method and a string or integer id"
        raise A2aRefused(400, rpc_error(None, INVALID_REQUEST, text), "rejected")
    params = msg.get("params", {})
    if not isinstance(params, dict):
        raise A2aRefused(
            200, rpc_error(rid, INVALID_PARAMS, "params must be an object"), "rejected"
        )
    return msg


@dataclass(slots=True)
class NamedIds:
    """The ids a request names: its task (get, cancel, subscribe, a message's ``taskId``),
    its context, and the tasks a message refers to."""

    task: str | None = None
    context: str | None = None
    references: tuple[str, ...] = ()


def _snake(name: str) -> str:
    """``taskId`` → ``task_id``: the proto field name a ProtoJSON parser accepts too."""
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def pick(obj: dict[str, Any], *names: str) -> Any:
    """The member ``obj`` gives under any spelling of ``names`` — each JSON name and its proto
    field name (a ProtoJSON parser, as the SDKs' servers use, accepts both, A2A §5.5). Two
    spellings given at once are refused (ValueError): the agent could read the other one."""
    found = [n for name in names for n in dict.fromkeys((name, _snake(name))) if n in obj]
    if len(found) > 1:
        raise ValueError(f"{found[0]!r} is given twice ({', '.join(found)})")
    return obj[found[0]] if found else None


def _string(obj: dict[str, Any], what: str, *names: str) -> str | None:
    value = pick(obj, *names)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    return value


def named(method: Method, params: dict[str, Any]) -> NamedIds:
    """What ``params`` names (ValueError: an id of the wrong type or given twice, a missing
    task id or message)."""
    if method.names_task:
        task = _string(params, "the task id", "id")
        if task is None:
            raise ValueError("the task id is required")
        return NamedIds(task=task)
    if method.kind == "list":
        return NamedIds(context=_string(params, "contextId", "contextId"))
    if method.kind not in ("send", "stream"):
        return NamedIds()
    message = pick(params, "message", "request")  # 0.3's proto names it ``request``
    if not isinstance(message, dict):
        raise ValueError("a message is required")
    refs = pick(message, "referenceTaskIds") or []
    if not isinstance(refs, list) or not all(isinstance(r, str) and r for r in refs):
        raise ValueError("referenceTaskIds must be a list of task ids")
    return NamedIds(
        _string(message, "taskId", "taskId"),
        _string(message, "contextId", "contextId"),
        tuple(refs),
    )


def asks_push(params: dict[str, Any]) -> bool:
    """Whether a send names a push-notification config, in any spelling (1.0
    ``taskPushNotificationConfig``, 0.3 ``pushNotificationConfig``, 0.3's proto
    ``push_notification``): any member of its configuration whose name says push."""
    config = pick(params, "configuration")
    if not isinstance(config, dict):
        return False
    return any("push" in str(k).lower() and v is not None for k, v in config.items())


@dataclass(slots=True)
class Facts:
    """What an answer (or one stream event) says: the ids it names and the state it reports."""

    tasks: list[str]
    contexts: list[str]
    state: str | None = None
    #: a stream is over after it (a final or interrupted state, a message, an error)
    final: bool = False


def state_name(raw: Any) -> str | None:
    """``TASK_STATE_INPUT_REQUIRED`` (1.0) and ``input-required`` (0.3) read ``input_required``.

    >>> state_name("TASK_STATE_COMPLETED"), state_name("input-required"), state_name(3)
    ('completed', 'input_required', None)
    """
    if not isinstance(raw, str):
        return None
    return raw.removeprefix("TASK_STATE_").lower().replace("-", "_") or None


def _first(obj: dict[str, Any], name: str) -> Any:
    """An answer's member under its JSON name, else its proto field name."""
    value = obj.get(name)
    return obj.get(_snake(name)) if value is None else value


def _task_facts(task: dict[str, Any], facts: Facts) -> None:
    if isinstance(task.get("id"), str):
        facts.tasks.append(task["id"])
    _context(task, facts)
    status = task.get("status")
    if isinstance(status, dict):
        facts.state = state_name(status.get("state")) or facts.state


def _context(obj: dict[str, Any], facts: Facts) -> None:
    context = _first(obj, "contextId")
    if isinstance(context, str):
        facts.contexts.append(context)


def _event_facts(obj: dict[str, Any], kind: str, facts: Facts) -> None:
    if kind == "task":
        _task_facts(obj, facts)
        return
    task = _first(obj, "taskId")
    if isinstance(task, str):
        facts.tasks.append(task)
    _context(obj, facts)
    if kind == "message":
        facts.final = True  # a message answers the whole request (A2A §3.1.2)
    elif kind == "status":
        status = obj.get("status")
        if isinstance(status, dict):
            facts.state = state_name(status.get("state"))
        if obj.get("final") is True:  # 0.3 says so itself
            facts.final = True


_WRAPPED = {
    "task": "task", "message": "message", "msg": "message", "statusUpdate": "status",
    "status_update": "status", "artifactUpdate": "artifact", "artifact_update": "artifact",
}  # fmt: skip
_KINDS = {
    "task": "task",
    "message": "message",
    "status-update": "status",
    "artifact-update": "artifact",
}


def facts_of(result: Any, method: Method) -> Facts:
    """The facts of a result: a Task (get, cancel), a send's answer or one stream event (1.0
    wraps it, 0.3 names its ``kind``), a list's tasks."""
    facts = Facts([], [])
    if not isinstance(result, dict):
        return facts
    if method.kind in ("get", "cancel"):
        _task_facts(result, facts)
    elif method.kind == "list":
        for task in result.get("tasks") or ():
            if isinstance(task, dict):
                _task_facts(task, facts)
    else:
        for key, kind in _WRAPPED.items():
            inner = result.get(key)
            if isinstance(inner, dict):
                _event_facts(inner, kind, facts)
                break
        else:
            bare = _KINDS.get(str(result.get("kind")))
            if bare is not None:
                _event_facts(result, bare, facts)
    if facts.state in _FINAL:
        facts.final = True
    return facts


__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "METHODS",
    "METHOD_NOT_FOUND",
    "PUSH_NOT_SUPPORTED",
    "TASK_NOT_FOUND",
    "A2aRefused",
    "Facts",
    "Method",
    "NamedIds",
    "asks_push",
    "facts_of",
    "named",
    "parse_rpc",
    "pick",
    "refusal",
    "rest_error",
    "rpc_error",
    "state_name",
]
