"""``gateway doctor``: the slow-response checklist as one command (docs/spec.md §17, issue 14).

It runs from the outside, against any OpenAI-compatible base URL (the gateway, a backend, a public
API), the checks an engineer runs when "the model is slow", and prints one row per check: name,
measured value, threshold, verdict (``ok`` | ``warn`` | ``fail`` | ``skip``), what was seen
(``detail``) and a one-line hint of what to do.

How each row is measured:

- ``dns``, ``connect``, ``tls``: one :func:`gateway.client.probe.probe` of ``GET {base}/models``
  on a new connection; each value is that step alone (the probe's marks are cumulative, like
  curl's).
- ``http2`` (reuse): ``--requests`` GETs of ``/models`` on one client; the value is what was
  seen (``HTTP/1.1, 1 connection for 5 requests``); ok only when every request succeeded and
  they shared a connection (a failing request fails, a new connection per request fails).
- a ``/models`` that answers 404 on a base URL without ``/v1`` while ``BASE/v1/models``
  answers: the hints (and the error when no ``--model`` was given) say ``did you mean BASE/v1?``.
- ``ttfb``: a small non-streamed chat completion, headers sent to headers received.
- ``encoding``: the coding of an answer of at least 1 KiB asked for with ``Accept-Encoding: br,
  zstd, gzip`` (see :func:`_check_encoding` for which answer).
- ``streaming``: a ``stream: true`` chat completion; every SSE event is time-stamped by the read
  that brought it: content type, no Content-Length, TTFT, inter-event gaps p50/p99, ``[DONE]``,
  and whether the events came bunched after a long wait (something buffered them).
- ``proxy``: the ``Server-Timing`` of the ttfb answer (``gateway`` and ``upstream`` entries).
- ``cache``: one deterministic request (temperature 0) twice: ``x-gateway-cache``, ``Age``.

Requests that measure the upstream path carry ``Cache-Control: no-store`` and a unique prompt, so
no cache replay is judged as the model's speed; only the cache row repeats a request.

The gateway's request path never imports this module (nor anything in :mod:`gateway.client`).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import httpx2
import orjson

from gateway.client.probe import ProbeError, ProbeResult, Target, make_ssl_context, probe
from gateway.encoding import DecodedTooLarge, DecodeError, UnsupportedEncoding, make_decoder
from gateway.streaming.sse import DONE, SSEParser, event_data

__all__ = [
    "DEFAULT_THRESHOLDS",
    "Check",
    "DoctorError",
    "Options",
    "Report",
    "parse_thresholds",
    "run",
]

Verdict = Literal["ok", "warn", "fail", "skip"]

# ---------------------------------------------------------------- thresholds (docs/spec.md §17)
#
# Above a threshold a row warns; what fails is stated per check (errors, a buffered stream, no
# [DONE], a new connection per request). All are overridable: --threshold name=value.

#: a cached or nearby resolver answers in a few ms; 300 ms is a resolver miss over a slow path,
#: paid again by every client that does not keep its connections
DNS_MS: Final = 300.0
#: the TCP handshake is one round trip; a second is a far-away or lossy link (Linux retransmits
#: a lost SYN after 1 s, so a connect over 1 s usually means a lost packet)
CONNECT_MS: Final = 1000.0
#: TLS 1.3 adds one round trip to the connect; over 200 ms is TLS 1.2's two round trips on a long
#: path, an overloaded terminator, or OCSP/CRL fetching on the server side
TLS_MS: Final = 200.0
#: a non-streamed answer arrives only after the whole generation; past ~2 s a person waiting
#: notices (and most chat UIs stream for that reason)
TTFB_MS: Final = 2000.0
#: the same 2 s for the first token of a stream (the wait a user sees before text appears)
TTFT_MS: Final = 2000.0
#: a proxy's own work (auth, routing, a cache lookup) costs a few ms; 30 ms means it does
#: something slow per request (a remote lookup, a new upstream connection, synchronous logging)
PROXY_MS: Final = 30.0
#: "bunched" needs a wait a person notices before the first event; it also keeps an instant
#: backend (a mock, a cache replay), whose events all arrive at once after ~0 ms, from being judged
BUNCH_WAIT_MS: Final = 100.0
#: ...and all events inside this fraction of that wait: a live stream spreads its events over the
#: generation (24+ tokens at up to ~1000 tokens/s take 24+ ms), a buffered one releases them in
#: one or two reads
BUNCH_RATIO: Final = 0.1

DEFAULT_THRESHOLDS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "dns": DNS_MS,
        "connect": CONNECT_MS,
        "tls": TLS_MS,
        "ttfb": TTFB_MS,
        "streaming": TTFT_MS,
        "proxy": PROXY_MS,
        "bunch_wait": BUNCH_WAIT_MS,
        "bunch_ratio": BUNCH_RATIO,
    }
)
#: other names people will try for the same thresholds
_ALIASES: Final = MappingProxyType({"ttft": "streaming", "gateway": "proxy"})

#: bodies under 1 KiB rightly stay identity (docs/spec.md §9), so they say nothing about compression
MIN_ENCODED_BYTES: Final = 1024
#: fewer stream events than this cannot show whether they were paced or bunched
STREAM_MIN_EVENTS: Final = 4
#: request sizes: small enough to be cheap on a paid API, big enough to measure
TTFB_MAX_TOKENS: Final = 16
STREAM_MAX_TOKENS: Final = 32
CACHE_MAX_TOKENS: Final = 8
#: only when the server lists no embedding model (see _check_encoding)
ENCODING_MAX_TOKENS: Final = 300
ACCEPT_ENCODING: Final = "br, zstd, gzip"
#: a decoded answer larger than this is a bug or a bomb, not something to measure
_MAX_DECODED: Final = 64 * 1024 * 1024
USER_AGENT: Final = "gateway-doctor/1"

#: Server-Timing entry names read as "time in the proxy" / "time in the upstream"
_PROXY_ENTRIES: Final = ("gateway", "proxy", "overhead")
_UPSTREAM_ENTRIES: Final = ("upstream", "origin", "backend")


class DoctorError(Exception):
    """The target cannot be checked at all (unreachable, not a URL, no model): one line."""


def parse_thresholds(items: Sequence[str]) -> dict[str, float]:
    """The defaults with ``name=value`` overrides applied (``ValueError`` names the bad one)."""
    out = dict(DEFAULT_THRESHOLDS)
    for item in items:
        name, sep, raw = item.partition("=")
        name = _ALIASES.get(name.strip(), name.strip())
        if not sep or name not in out:
            known = ", ".join([*DEFAULT_THRESHOLDS, *_ALIASES])
            raise ValueError(f"--threshold {item!r}: expected NAME=VALUE with NAME one of {known}")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"--threshold {item!r}: {raw!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"--threshold {item!r}: must be a number >= 0")
        out[name] = value
    return out


@dataclass(frozen=True, slots=True)
class Options:
    base_url: str
    model: str | None = None
    api_key: str | None = None
    requests: int = 5
    #: overrides of :data:`DEFAULT_THRESHOLDS` (missing names keep their default)
    thresholds: Mapping[str, float] = field(default_factory=dict)
    timeout: float = 30.0
    cacert: str | None = None


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    #: a number in ``unit``, a word (the coding, the cache result), or None when not measured
    value: float | str | None
    unit: str | None
    threshold: float | str | None
    verdict: Verdict
    #: what to do about it (empty when there is nothing to do)
    hint: str = ""
    #: what was seen, for people (TLS version and ALPN, event counts and gaps, ...)
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        value = round(self.value, 3) if isinstance(self.value, float) else self.value
        return {
            "name": self.name,
            "value": value,
            "unit": self.unit,
            "threshold": self.threshold,
            "verdict": self.verdict,
            "hint": self.hint,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Report:
    target: str
    model: str | None
    checks: list[Check]

    def exit_code(self) -> int:
        return 1 if any(c.verdict == "fail" for c in self.checks) else 0

    def to_json(self) -> str:
        obj = {
            "target": self.target,
            "model": self.model,
            "checks": [c.as_json() for c in self.checks],
        }
        return orjson.dumps(obj).decode()

    def render(self) -> str:
        rows = [("check", "value", "threshold", "verdict", "detail")]
        rows += [
            (
                c.name,
                _show(c.value, c.unit),
                _show(c.threshold, c.unit if isinstance(c.threshold, float) else None, exact=True),
                c.verdict,
                c.detail,
            )
            for c in self.checks
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"gateway doctor {self.target}  model={self.model or '-'}", ""]
        for i, row in enumerate(rows):
            cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1])]
            cells += [row[2].rjust(widths[2]), row[3].ljust(widths[3]), row[4]]
            lines.append("  ".join(cells).rstrip())
            hint = self.checks[i - 1].hint if i else ""
            if hint:
                lines.append(" " * (sum(widths) + 8) + "hint: " + hint)
        failed = [c.name for c in self.checks if c.verdict == "fail"]
        warned = [c.name for c in self.checks if c.verdict == "warn"]
        lines.append("")
        lines.append(
            f"{len(failed)} fail{'' if not failed else ' (' + ', '.join(failed) + ')'}, "
            f"{len(warned)} warn{'' if not warned else ' (' + ', '.join(warned) + ')'}"
        )
        return "\n".join(lines)


def _show(value: float | str | None, unit: str | None, *, exact: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if unit == "ms" and not exact:
        digits = 2 if value < 10 else 1 if value < 1000 else 0
        return f"{value:.{digits}f} ms"
    text = f"{value:g}"
    return f"{text} {unit}" if unit else text


# ---------------------------------------------------------------- the run


def run(options: Options) -> Report:
    """Run every check against ``options.base_url``; :class:`DoctorError` when none can run."""
    base = options.base_url.rstrip("/")
    try:
        target = Target.parse(base)
    except ValueError as exc:
        raise DoctorError(str(exc)) from None
    th = {**DEFAULT_THRESHOLDS, **options.thresholds}
    auth = [("Authorization", f"Bearer {options.api_key}")] if options.api_key else []

    try:
        result: ProbeResult | None = probe(
            base + "/models", headers=auth, timeout=options.timeout, cacert=options.cacert
        )
        marks = result.marks if result else {}
    except ProbeError as exc:
        if exc.stage in ("dns", "connect", "tls"):
            raise DoctorError(f"{base}: {exc.message}") from None
        result, marks = None, exc.marks  # connected: the rows below say what went wrong
    checks = _network_checks(target, result, marks, th)

    with _Session(base, options) as session:
        reuse, listing = _check_reuse(session, options.requests)
        models = listing.models
        model = options.model or _pick(models, embedding=False)
        if model is None:
            raise DoctorError(_no_model(session, listing))
        ttfb, answer = _check_ttfb(session, model, th)
        encoding = _check_encoding(session, model, answer, _pick(models, embedding=True))
        streaming, stream = _check_streaming(session, model, th)
        proxy = _check_proxy([a for a in (answer, stream) if a is not None], th)
        cache = _check_cache(session, model)
    checks += [ttfb, reuse, encoding, streaming, proxy, cache]
    return Report(base, model, checks)


# ---------------------------------------------------------------- dns, connect, tls


def _network_checks(
    target: Target, result: ProbeResult | None, marks: Mapping[str, float], th: Mapping[str, float]
) -> list[Check]:
    def step(name: str, after: str) -> float | None:
        if name not in marks or after not in marks:
            return None
        return (marks[name] - marks[after]) * 1000

    dns_ms = marks.get("dns", 0.0) * 1000
    literal = _is_ip(target.host)
    where = result.ip if result else "?"
    dns = _judge(
        "dns",
        dns_ms,
        th["dns"],
        f"{target.host} is an IP literal: no lookup" if literal else f"{target.host} -> {where}",
        "slow name lookup: a local DNS cache (systemd-resolved, dnsmasq, nscd) or another "
        "resolver; clients that keep their connections pay it once",
    )
    connect = _judge(
        "connect",
        step("connect", "dns"),
        th["connect"],
        f"TCP handshake with {where}:{target.port}",
        "slow TCP connect (a long or lossy network path): a backend closer to the clients, "
        "and pooled keep-alive connections so it is paid once",
    )
    if target.scheme != "https":
        tls = Check("tls", None, "ms", th["tls"], "skip", detail="plain http: no TLS")
    else:
        detail = (
            f"{result.tls_version}, ALPN {result.alpn or 'none'}" if result else "handshake done"
        )
        tls = _judge(
            "tls",
            step("tls", "connect"),
            th["tls"],
            detail,
            "slow TLS handshake: TLS 1.3 (one round trip), session resumption, keep-alive so it "
            "is paid once, a TLS terminator closer to the clients",
        )
    return [dns, connect, tls]


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _judge(name: str, value: float | None, limit: float, detail: str, hint: str) -> Check:
    if value is None:
        return Check(name, None, "ms", limit, "fail", "not measured: the probe stopped", detail)
    if value > limit:
        return Check(name, value, "ms", limit, "warn", hint, detail)
    return Check(name, value, "ms", limit, "ok", "", detail)


# ---------------------------------------------------------------- one client for the rest


@dataclass(slots=True)
class _Answer:
    status: int
    headers: httpx2.Headers
    http_version: str
    #: seconds from sending the request to its response headers
    ttfb: float
    #: bytes over the wire (still coded) and decoded
    wire_size: int
    body: bytes
    #: (seconds since sending, decoded bytes) per read, for streams
    reads: list[tuple[float, bytes]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self, not_found: str) -> str:
        """``HTTP 401: Invalid API key`` from an OpenAI-shaped error body (or just the status);
        ``not_found`` is what a 404 probably means (see :meth:`_Session.check_base`)."""
        message = ""
        try:
            obj = orjson.loads(self.body)
            err = obj.get("error") if isinstance(obj, dict) else None
            message = str(err.get("message", "")) if isinstance(err, dict) else ""
        except orjson.JSONDecodeError:
            message = self.body[:120].decode(errors="replace").strip()
        text = f"HTTP {self.status}" + (f": {message[:120]}" if message else "")
        if self.status in (401, 403):
            text += " (pass the key's env var with --api-key-env)"
        elif self.status == 404:
            text += f" ({not_found})"
        return text


class _RequestFailed(Exception):
    pass


class _Session:
    """One httpx2 client (HTTP/2 when ALPN offers it), built before any request is timed."""

    def __init__(self, base: str, options: Options) -> None:
        self.base = base
        self.connections = 0
        #: what a 404 probably means; :meth:`check_base` sharpens it
        self.not_found = "check --model and the base URL"
        #: ``did you mean BASE/v1?`` once :meth:`check_base` found the API there
        self.v1_hint: str | None = None
        self._base_checked = False
        headers = {"user-agent": USER_AGENT}
        if options.api_key:
            headers["authorization"] = f"Bearer {options.api_key}"
        self.client = httpx2.Client(
            http2=True,
            trust_env=False,  # like the probe: the direct path is what is measured
            verify=make_ssl_context(options.cacert),
            timeout=options.timeout,
            headers=headers,
        )

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def error(self, answer: _Answer) -> str:
        return answer.error(self.not_found)

    def check_base(self) -> None:
        """After a 404 (once): when the base lacks ``/v1`` and ``BASE/v1/models`` answers, every
        404 hint says ``did you mean BASE/v1?``."""
        if self._base_checked or urlsplit(self.base).path.endswith("/v1"):
            return
        self._base_checked = True
        self.not_found = "an OpenAI-compatible base URL usually ends in /v1"
        with contextlib.suppress(_RequestFailed):
            if self.fetch("GET", "/v1/models").ok:
                self.v1_hint = self.not_found = f"did you mean {self.base}/v1?"

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            self.connections += 1

    def fetch(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        keep_reads: bool = False,
    ) -> _Answer:
        """One request, timed from the send; the body decoded. :class:`_RequestFailed` on a
        transport error or an undecodable body."""
        request = self.client.build_request(
            method,
            self.base + path,
            content=None if body is None else orjson.dumps(body),
            headers={
                "accept-encoding": ACCEPT_ENCODING,
                **({"content-type": "application/json"} if body is not None else {}),
                **(headers or {}),
            },
            extensions={"trace": self._trace},
        )
        start = time.perf_counter()
        try:
            response = self.client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            raise _RequestFailed(f"{method} {path}: {_describe(exc)}") from None
        try:
            ttfb = time.perf_counter() - start
            coding = response.headers.get("content-encoding", "identity")
            decoder = make_decoder(coding, _MAX_DECODED)
            wire = 0
            parts: list[bytes] = []
            reads: list[tuple[float, bytes]] = []
            for raw in response.iter_raw():
                at = time.perf_counter() - start
                wire += len(raw)
                data = decoder.decode(raw)
                parts.append(data)
                if keep_reads and data:
                    reads.append((at, data))
            parts.append(decoder.flush())
        except httpx2.HTTPError as exc:
            raise _RequestFailed(f"{method} {path}: {_describe(exc)}") from None
        except (UnsupportedEncoding, DecodeError, DecodedTooLarge) as exc:
            raise _RequestFailed(f"{method} {path}: undecodable body: {exc}") from None
        finally:
            response.close()
        return _Answer(
            status=response.status_code,
            headers=response.headers,
            http_version=response.http_version,
            ttfb=ttfb,
            wire_size=wire,
            body=b"".join(parts),
            reads=reads,
        )


def _describe(exc: httpx2.HTTPError) -> str:
    if isinstance(exc, httpx2.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _nonce() -> str:
    return uuid.uuid4().hex[:12]


def _uncacheable() -> dict[str, str]:
    return {"cache-control": "no-store"}


def _chat(model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        **extra,
    }


def _pick(models: list[str], *, embedding: bool) -> str | None:
    """The first chat model (or the first embedding model) of a /models listing."""
    for m in models:
        if ("embed" in m.lower()) == embedding:
            return m
    return models[0] if models and not embedding else None


# ---------------------------------------------------------------- http2 / reuse


#: the http2 row's threshold: N requests on one client reuse one connection
REUSE: Final = "1 connection"


@dataclass(frozen=True, slots=True)
class _Listing:
    """What ``GET /models`` said: the model ids, or why there are none."""

    models: list[str]
    error: str = ""


def _check_reuse(session: _Session, n: int) -> tuple[Check, _Listing]:
    """``n`` GETs of ``/models`` on one client: the protocol, and connections opened for them."""
    before = session.connections
    answers: list[_Answer] = []
    for _ in range(n):
        try:
            answers.append(session.fetch("GET", "/models"))
        except _RequestFailed as exc:
            hint = f"the requests failed: {exc}"
            return Check("http2", None, None, REUSE, "fail", hint), _Listing([], str(exc))
    opened = session.connections - before
    failed = next((a for a in answers if not a.ok), None)
    if failed is not None and failed.status == 404:
        session.check_base()
    error = session.error(failed) if failed is not None else ""
    listing = _Listing(next((_model_ids(a.body) for a in answers if a.ok), []), error)
    return _judge_reuse(session, answers, opened, error), listing


def _judge_reuse(session: _Session, answers: list[_Answer], opened: int, error: str) -> Check:
    """ok only when every request succeeded and they shared a connection; the value says what
    was seen (``HTTP/1.1, 1 connection for 5 requests``)."""
    n = len(answers)
    protocols = "/".join(sorted({a.http_version for a in answers}))
    value = f"{protocols}, {opened} connection{'s' if opened != 1 else ''} for {n} requests"
    statuses = Counter(a.status for a in answers)
    detail = "GET /models: " + ", ".join(f"HTTP {s} x{c}" for s, c in sorted(statuses.items()))
    if session.base.startswith("https") and protocols != "HTTP/2":
        detail += "; the server did not negotiate h2"

    def row(verdict: Verdict, hint: str = "") -> Check:
        return Check("http2", value, None, REUSE, verdict, hint, detail)

    if error:
        return row("fail", f"GET /models answered {error}: reuse counts only on answers that work")
    if n < 2:
        return row("skip")
    if opened <= 1:
        return row("ok")
    if opened >= n:
        return row(
            "fail",
            "a new connection per request: every call pays connect + TLS again; enable "
            "keep-alive (no Connection: close, a keepalive timeout > 0) or HTTP/2",
        )
    return row("warn", "the server closed kept-alive connections early: raise its keepalive limits")


def _no_model(session: _Session, listing: _Listing) -> str:
    """The one line when no model is known: the base URL's missing /v1 first, else --model."""
    if session.v1_hint is not None:
        return f"{session.base}: GET /models answered 404: {session.v1_hint}"
    why = listing.error or "it listed none"
    return f"{session.base}: GET /models gave no model ({why}); pass --model"


def _model_ids(body: bytes) -> list[str]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return []
    return [d["id"] for d in data if isinstance(d, dict) and isinstance(d.get("id"), str)]


# ---------------------------------------------------------------- ttfb


def _check_ttfb(
    session: _Session, model: str, th: Mapping[str, float]
) -> tuple[Check, _Answer | None]:
    limit = th["ttfb"]
    body = _chat(model, f"gateway doctor {_nonce()}: say hello in one sentence.", TTFB_MAX_TOKENS)
    try:
        answer = session.fetch("POST", "/chat/completions", body, _uncacheable())
    except _RequestFailed as exc:
        return Check("ttfb", None, "ms", limit, "fail", str(exc)), None
    ms = answer.ttfb * 1000
    detail = f"HTTP {answer.status}, {len(answer.body)} B, max_tokens {TTFB_MAX_TOKENS}"
    if not answer.ok:
        return Check("ttfb", ms, "ms", limit, "fail", session.error(answer), detail), answer
    hint = (
        "a non-streamed answer waits for the whole generation: stream: true, a lower "
        "max_tokens, or a closer / less loaded backend"
    )
    return _judge("ttfb", ms, limit, detail, hint), answer


# ---------------------------------------------------------------- encoding


def _check_encoding(
    session: _Session, model: str, answer: _Answer | None, embedding_model: str | None
) -> Check:
    """The coding of a >= 1 KiB answer, from the first of these that is big enough:

    1. the ttfb chat answer (rarely: it is small on purpose);
    2. an embedding of a short text with an embedding model the server lists: a vector is
       256-3072 floats, 5-60 KB of JSON on every embedding model, it costs no generation time
       and a fraction of a cent — the cheapest big answer an OpenAI-compatible API gives;
    3. otherwise a chat completion asking for a long answer (max_tokens 300): every server has
       chat/completions, but the size then depends on the model, and it takes generation time.

    Under 1 KiB after all that: ``skip`` (small bodies rightly stay identity, docs/spec.md §9).
    """
    chosen, what, largest, errors = _big_answer(session, model, answer, embedding_model)
    if chosen is None:
        if errors and not largest:
            return Check("encoding", None, None, None, "fail", "; ".join(errors))
        detail = f"largest answer {largest} B < {MIN_ENCODED_BYTES} B: too small to judge"
        return Check("encoding", None, None, None, "skip", "", detail)
    coding = chosen.headers.get("content-encoding", "").strip().lower() or "identity"
    decoded = len(chosen.body)
    if coding == "identity":
        detail = f"{decoded} B sent uncompressed; {what}"
        hint = (
            "answers >= 1 KiB go uncompressed: enable br/zstd/gzip on the server or the proxy "
            "in front of it (JSON and SSE shrink 3-10x)"
        )
        return Check("encoding", coding, None, None, "warn", hint, detail)
    ratio = decoded / chosen.wire_size if chosen.wire_size else 0.0
    detail = f"{chosen.wire_size} B on the wire for {decoded} B ({ratio:.1f}x); {what}"
    return Check("encoding", coding, None, None, "ok", "", detail)


def _big_answer(
    session: _Session, model: str, answer: _Answer | None, embedding_model: str | None
) -> tuple[_Answer | None, str, int, list[str]]:
    """(the first answer >= 1 KiB, what it was, the largest size seen, errors met)."""
    tries: list[tuple[str, Callable[[], _Answer]]] = []
    if answer is not None:
        tries.append(("the ttfb chat answer", lambda: answer))
    if embedding_model:
        body = {"model": embedding_model, "input": f"gateway doctor {_nonce()}"}
        tries.append(
            (
                f"an embedding from {embedding_model}",
                lambda: session.fetch("POST", "/embeddings", body, _uncacheable()),
            )
        )
    prompt = f"gateway doctor {_nonce()}: write the numbers from one to three hundred in words."
    chat = _chat(model, prompt, ENCODING_MAX_TOKENS)
    tries.append(
        (
            f"a chat answer (max_tokens {ENCODING_MAX_TOKENS})",
            lambda: session.fetch("POST", "/chat/completions", chat, _uncacheable()),
        )
    )
    largest, errors = 0, []
    for what, get in tries:
        try:
            candidate = get()
        except _RequestFailed as exc:
            errors.append(str(exc))
            continue
        if not candidate.ok:
            errors.append(f"{what}: {session.error(candidate)}")
            continue
        largest = max(largest, len(candidate.body))
        if len(candidate.body) >= MIN_ENCODED_BYTES:
            return candidate, what, largest, errors
    return None, "", largest, errors


# ---------------------------------------------------------------- streaming


@dataclass(frozen=True, slots=True)
class StreamShape:
    """What the arrival times of a stream's SSE ``data:`` events say."""

    #: seconds from sending the request to each data event's read
    arrivals: list[float]
    #: seconds to the first event carrying content (None: no content event)
    ttft: float | None
    done: bool

    @property
    def gaps_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]

    def bunched(self, wait_ms: float, ratio: float) -> bool:
        """Events that arrive all together after a long wait: something held them back."""
        if len(self.arrivals) < STREAM_MIN_EVENTS:
            return False
        wait = self.arrivals[0] * 1000
        spread = (self.arrivals[-1] - self.arrivals[0]) * 1000
        return wait >= wait_ms and spread < ratio * wait


def stream_shape(reads: Sequence[tuple[float, bytes]]) -> StreamShape:
    """Split decoded reads into SSE events (:class:`~gateway.streaming.sse.SSEParser`, the
    gateway's own: lines end with LF, CRLF or CR); each event gets the time of the read that
    completed it.

    >>> s = stream_shape([(0.5, b'data: {"choices": [{"delta": {"content": "a"}}]}\\n\\n'),
    ...                   (0.6, b"data: [DONE]\\r\\r")])
    >>> s.arrivals, s.ttft, s.done
    ([0.5, 0.6], 0.5, True)
    """
    parser = SSEParser()
    stamped: list[tuple[float, bytes]] = []
    last = 0.0
    for at, data in reads:
        # a blank line ended by a CR at the end of the last read: its event was complete then,
        # the parser only waited to see whether an LF followed (CRLF)
        held = parser.pending[-2:] in (b"\r\r", b"\n\r")
        events = parser.feed(data)
        stamped += [(last if i == 0 and held else at, raw) for i, raw in enumerate(events)]
        last = at
    stamped += [(last, raw) for raw in parser.finish()]
    arrivals: list[float] = []
    ttft: float | None = None
    done = False
    for at, raw in stamped:
        payload = event_data(raw)
        if payload is None:
            continue  # a comment or keep-alive
        arrivals.append(at)
        if payload == DONE:
            done = True
        elif ttft is None and _has_content(payload):
            ttft = at
    return StreamShape(arrivals, ttft, done)


def _has_content(payload: bytes) -> bool:
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return False
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
            return True
        if choice.get("text"):
            return True
    return False


def _percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _check_streaming(
    session: _Session, model: str, th: Mapping[str, float]
) -> tuple[Check, _Answer | None]:
    limit = th["streaming"]
    prompt = f"gateway doctor {_nonce()}: count from 1 to 40, one number per line."
    body = _chat(model, prompt, STREAM_MAX_TOKENS, stream=True)
    headers = {**_uncacheable(), "accept": "text/event-stream"}
    try:
        answer = session.fetch("POST", "/chat/completions", body, headers, keep_reads=True)
    except _RequestFailed as exc:
        return Check("streaming", None, "ms", limit, "fail", str(exc)), None
    if not answer.ok:
        return Check("streaming", None, "ms", limit, "fail", session.error(answer)), answer
    content_type = answer.headers.get("content-type", "")
    if not content_type.lower().startswith("text/event-stream"):
        hint = f"stream: true was answered as {content_type or 'no content type'}, not SSE"
        return Check("streaming", None, "ms", limit, "fail", hint), answer
    shape = stream_shape(answer.reads)
    if not shape.arrivals:
        return Check("streaming", None, "ms", limit, "fail", "the stream had no data events"), (
            answer
        )
    ttft = shape.ttft if shape.ttft is not None else shape.arrivals[0]
    gaps = shape.gaps_ms
    parts = [f"{len(shape.arrivals)} events"]
    if gaps:
        parts.append(f"gaps p50 {_percentile(gaps, 50):.1f} ms p99 {_percentile(gaps, 99):.1f} ms")
    spread = (shape.arrivals[-1] - shape.arrivals[0]) * 1000
    parts.append(f"first event {shape.arrivals[0] * 1000:.0f} ms, all within {spread:.0f} ms")
    parts.append("[DONE]" if shape.done else "no [DONE]")
    if len(shape.arrivals) < STREAM_MIN_EVENTS:
        parts.append("too few events to judge buffering")
    detail = ", ".join(parts)
    value = ttft * 1000

    def row(verdict: Verdict, hint: str) -> tuple[Check, _Answer]:
        return Check("streaming", value, "ms", limit, verdict, hint, detail), answer

    if "content-length" in answer.headers:
        return row("fail", "the stream came with a Content-Length: it was buffered whole")
    if shape.bunched(th["bunch_wait"], th["bunch_ratio"]):
        return row(
            "fail",
            "events arrived bunched after a long wait: something buffers the stream; disable "
            "proxy buffering (X-Accel-Buffering: no, nginx proxy_buffering off) and flush "
            "compression after every event",
        )
    if not shape.done:
        return row(
            "fail", "the stream ended without data: [DONE]: cut by the server or a proxy timeout"
        )
    if value > limit:
        return row(
            "warn",
            "the first token is slow: a shorter prompt, a smaller or less loaded model, a "
            "closer backend",
        )
    return row("ok", "")


# ---------------------------------------------------------------- proxy vs upstream


def server_timing(value: str) -> dict[str, float]:
    """``name;dur=1.5;desc="x", other`` → ``{"name": 1.5}`` (entries without dur are left out).

    >>> server_timing('cache;desc=miss, upstream;dur=12.5, gateway;dur=0.8')
    {'upstream': 12.5, 'gateway': 0.8}
    """
    out: dict[str, float] = {}
    for entry in _split_outside_quotes(value, ","):
        name, *params = (p.strip() for p in _split_outside_quotes(entry, ";"))
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip().lower() == "dur":
                with contextlib.suppress(ValueError):
                    out[name.lower()] = float(raw.strip().strip('"'))
    return out


def _split_outside_quotes(text: str, sep: str) -> Iterator[str]:
    start, quoted = 0, False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            yield text[start:i]
            start = i + 1
    yield text[start:]


def _check_proxy(answers: Sequence[_Answer], th: Mapping[str, float]) -> Check:
    limit = th["proxy"]
    headers = [a.headers.get("server-timing") for a in answers if a.ok]
    present = [h for h in headers if h]
    if not present:
        detail = "no Server-Timing header: the target does not report proxy time"
        return Check("proxy", None, "ms", limit, "skip", "", detail)
    for header in present:
        entries = server_timing(header)
        proxy_name = next((n for n in _PROXY_ENTRIES if n in entries), None)
        if proxy_name is None:
            continue
        proxy = entries[proxy_name]
        detail = f"{proxy_name} {proxy:.1f} ms"
        upstream_name = next((n for n in _UPSTREAM_ENTRIES if n in entries), None)
        if upstream_name is not None:
            detail += f", {upstream_name} {entries[upstream_name]:.1f} ms"
        detail += " (Server-Timing)"
        hint = (
            "the proxy itself adds the time: read its hops (auth, router, cache) in "
            "Server-Timing or its traces; a slow cache store, a new upstream connection per request"
        )
        return _judge("proxy", proxy, limit, detail, hint)
    detail = f"Server-Timing has no gateway/upstream entries: {present[0][:80]}"
    return Check("proxy", None, "ms", limit, "skip", "", detail)


# ---------------------------------------------------------------- cache


def _check_cache(session: _Session, model: str) -> Check:
    """A deterministic request (temperature 0, a fixed prompt) twice; the second should HIT."""
    body = _chat(model, "gateway doctor: cache check.", CACHE_MAX_TOKENS, temperature=0)
    results: list[str] = []
    age = None
    for _ in range(2):
        try:
            answer = session.fetch("POST", "/chat/completions", body)
        except _RequestFailed as exc:
            return Check("cache", None, None, "HIT", "fail", str(exc))
        if not answer.ok:
            return Check("cache", None, None, "HIT", "fail", session.error(answer))
        state = answer.headers.get("x-gateway-cache")
        if state is None:
            detail = "no x-gateway-cache header: not a gateway with a response cache"
            return Check("cache", None, None, "HIT", "skip", "", detail)
        results.append(state.upper())
        age = answer.headers.get("age")
    second = results[-1]
    detail = f"{results[0]} then {second}" + (f", Age {age} s" if age is not None else "")
    if second == "HIT":
        return Check("cache", second, None, "HIT", "ok", "", detail)
    hint = (
        "a repeated deterministic request was not served from the cache: check [cache] "
        "(backend, mode, ttl; Redis reachable?)"
    )
    return Check("cache", second, None, "HIT", "warn", hint, detail)
