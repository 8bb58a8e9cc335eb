"""The built-in mock backend: deterministic answers, realistic pacing, five APIs.

Used by the embedded default (``mock://`` backends, in process), by ``gateway mock-upstream``
(the same engine behind a real HTTP server), by the tests and by the load tests.

Endpoints (paths after ``/v1``): ``/chat/completions``, ``/completions``, ``/embeddings``,
``/models`` (OpenAI), ``/responses`` (OpenAI Responses API), ``/messages`` and
``/messages/count_tokens`` (Anthropic Messages API, with Anthropic's error shape). Each answers
JSON, or SSE with ``"stream": true``, shaped as the official SDKs parse it; a Responses stream ends
after its terminal event (no ``[DONE]``), a Messages stream after ``event: message_stop``.

Knobs (milliseconds / tokens per second / tokens), from the ``mock://`` URL query, the
``mock-upstream`` CLI flags (``--latency-ms``, ``--ttft-ms``, ``--tokens-per-s``), or per request
from ``x-mock-latency-ms``, ``x-mock-ttft-ms``, ``x-mock-tokens-per-s``, ``x-mock-output-tokens``
headers (a bad value is a 400 in the endpoint's error shape):

- ``latency_ms``: before the response headers;
- ``ttft_ms``: from the headers to the first content token;
- ``tokens_per_s``: pace of the following tokens (0 = as fast as possible);
- ``output_tokens``: the length of an answer the request does not limit [12].

``capacity`` (``mock://?capacity=N``, ``--capacity N``; not per request) makes the mock a small
model server: at most N model calls run at once, the others wait in a queue, and ``/metrics``
reports them in vLLM's names (gateway/mock/capacity.py). Its answers' headers go out at once,
their bodies once the queue and the answer's own time are over.

A JSON answer takes what its stream would have: latency + ttft + tokens / tokens_per_s.
A stream sends its opening events with the headers, the first token after ``ttft_ms``, then one
event per token, then its closing events at once.

Length: chat/completions and completions answer exactly ``max_tokens`` (or
``max_completion_tokens``) tokens when given (finish_reason ``length``), else ``output_tokens``
(``stop``). Responses and Messages answer ``output_tokens`` tokens unless ``max_output_tokens`` /
``max_tokens`` is smaller, which cuts the answer there: status ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"``, or stop_reason ``max_tokens``.

Tools and structured outputs (gateway/mock/tools.py decides, gateway/mock/schema.py makes the
values), so agent frameworks' tool loops and ``parse`` helpers run on the mock:

- a request offering function tools (``tool_choice`` not ``none``) whose conversation does not
  end with tool results is answered with one call of the first tool (or the one ``tool_choice``
  names; an agent CLI's MCP tool, ``mcp__…``, before its own), its arguments made to fit the
  tool's JSON schema: chat ``tool_calls`` (finish_reason ``tool_calls``), a Responses
  ``function_call`` item (with its ``namespace`` for a namespace tool's function), a Messages
  ``tool_use`` block (stop_reason ``tool_use``); streamed as each API streams them, one
  argument piece per token. A tool call is always answered whole (the length limits do not cut
  it);
- a conversation ending with tool results is answered with text that quotes them
  ("The get_weather tool returned: …");
- a JSON answer asked for (chat ``response_format`` json_schema / json_object, Responses
  ``text.format``, Messages ``output_config.format``) is JSON valid for the schema (after tool
  results, its strings quote them).

These answers are deterministic per prompt like the text; their length is what they need.
Responses ids (``resp_…``, item and call ids) are unique per response (stateful requests find a
response by id); chat and Messages ids follow the prompt.

``GET /models`` lists :data:`MODELS` (the names the README uses); every other name is served
too. Models with a meaning (any other name is an ordinary model):

- ``mock-status-NNN``: answers HTTP status NNN with the endpoint's error body (OpenAI's shape;
  Anthropic's on ``/messages``, its ``error.type`` following the status: 400
  invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error,
  413 request_too_large, 429 rate_limit_error, 500 api_error, 529 overloaded_error, ...);
- ``mock-cut-N``: a stream that stops after N content tokens (fewer if the answer is shorter)
  and ends without its end marker: no finish chunk and no ``data: [DONE]`` (chat/completions,
  completions), no ``response.*.done`` / ``response.completed`` (responses), no
  ``content_block_stop`` / ``message_delta`` / ``message_stop`` (messages). A JSON request to
  it is answered normally.

>>> import orjson
>>> body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
>>> r = reply("POST", "/chat/completions", body)
>>> r.status, r.content_type
(200, 'application/json')
>>> r = reply("POST", "/messages", body)
>>> r.status, orjson.loads(r.body or b"")["error"]["message"]
(400, 'max_tokens: Field required')
"""

from __future__ import annotations

from gateway.mock.engine.dispatch import MODELS, bad_request, reply
from gateway.mock.engine.knobs import (
    DEFAULT_COMPLETION_TOKENS,
    MAX_COMPLETION_TOKENS,
    MockSettings,
)
from gateway.mock.engine.openai_api import EMBEDDING_DIMENSIONS
from gateway.mock.engine.replies import MockReply

__all__ = [
    "DEFAULT_COMPLETION_TOKENS",
    "EMBEDDING_DIMENSIONS",
    "MAX_COMPLETION_TOKENS",
    "MODELS",
    "MockReply",
    "MockSettings",
    "bad_request",
    "reply",
]
