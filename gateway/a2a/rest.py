"""The HTTP+JSON binding's paths (A2A §11, and the 0.3 ``/v1/…`` paths) read as operations
(docs/spec.md §30)::

    POST message:send            SendMessage          POST v1/message:send     message/send
    POST message:stream          SendStreamingMessage POST v1/message:stream   message/stream
    GET  tasks/{id}              GetTask              GET  v1/tasks/{id}       tasks/get
    GET  tasks                   ListTasks
    POST tasks/{id}:cancel       CancelTask           POST v1/tasks/{id}:cancel
    GET|POST tasks/{id}:subscribe SubscribeToTask     GET|POST v1/tasks/{id}:subscribe
    *    tasks/{id}/pushNotificationConfigs[/{config}]   (refused)
    GET  extendedAgentCard                            GET  v1/card             (refused)

A 1.0 path may start with the interface's ``{tenant}`` segment (A2A §8.3.2), passed on as is.
Each operation is labelled by its JSON-RPC name of the same version, so metrics and spans
name it one way whichever binding carried it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from gateway.a2a.protocol import METHODS, Method

_FIRST = frozenset({"message:send", "message:stream", "tasks", "extendedAgentCard", "card"})
_NAMES = {
    ("1.0", "send"): "SendMessage", ("1.0", "stream"): "SendStreamingMessage",
    ("1.0", "get"): "GetTask", ("1.0", "list"): "ListTasks", ("1.0", "cancel"): "CancelTask",
    ("1.0", "subscribe"): "SubscribeToTask", ("1.0", "push"): "CreateTaskPushNotificationConfig",
    ("1.0", "card"): "GetExtendedAgentCard", ("0.3", "send"): "message/send",
    ("0.3", "stream"): "message/stream", ("0.3", "get"): "tasks/get",
    ("0.3", "list"): "tasks/list", ("0.3", "cancel"): "tasks/cancel",
    ("0.3", "subscribe"): "tasks/resubscribe", ("0.3", "push"): "tasks/pushNotificationConfig/set",
    ("0.3", "card"): "agent/getAuthenticatedExtendedCard",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class RestCall:
    #: the JSON-RPC name of the same operation (its label)
    name: str
    method: Method
    #: the task the path names (decoded), if any
    task: str | None
    #: appended to the agent's HTTP+JSON interface URL: the path as the client sent it
    path: str


def _operation(segments: list[str], http: str) -> tuple[str, str | None] | None:
    """(kind, task id as written) of the segments after the tenant and ``v1``."""
    head = segments[0]
    if len(segments) == 1:
        if head in ("message:send", "message:stream") and http == "POST":
            return ("send" if head.endswith("send") else "stream"), None
        if head in ("extendedAgentCard", "card") and http == "GET":
            return "card", None
        if head == "tasks" and http == "GET":
            return "list", None
        return None
    if head != "tasks" or not segments[1]:
        return None
    task = segments[1]
    if len(segments) == 2:
        if task.endswith(":cancel") and http == "POST":
            return "cancel", task[: -len(":cancel")]
        if task.endswith(":subscribe") and http in ("GET", "POST"):
            return "subscribe", task[: -len(":subscribe")]
        if http == "GET" and ":" not in task:
            return "get", task
        return None
    if segments[2] == "pushNotificationConfigs" and len(segments) <= 4:
        return "push", task
    return None


def parse(rest: str, http: str) -> RestCall | None:
    """The operation of path ``rest`` (after ``/a2a/{agent}/``) and HTTP method ``http``;
    None: no operation of the binding (a 404)."""
    segments = rest.split("/")
    version = "1.0"
    if segments[0] == "v1" and len(segments) > 1:
        version, segments = "0.3", segments[1:]
    elif segments[0] not in _FIRST and len(segments) > 1:
        segments = segments[1:]  # the interface's tenant
    found = _operation(segments, http)
    if found is None:
        return None
    kind, task = found
    if task is not None and not task:
        return None
    name = _NAMES[(version, kind)]
    return RestCall(name, METHODS[name], unquote(task) if task else None, rest)


__all__ = ["RestCall", "parse"]
