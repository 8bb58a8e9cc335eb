"""Fault soak: mixed traffic through the gateway to two faulty backends, bounded in time (SPEC §13).

    python loadtests/soak.py [--duration 600] [--clients 300] [--think-ms 100] [--seed 1]

It starts, each as its own process stopped by its own PID at the end:

- two fault-injecting upstreams (``python -m tests.faults``, toxiproxy's toxics as the model),
  each with its own 5xx bursts (503 to everything for 2 s out of every 40 s / 55 s);
- a gateway (``python -m gateway.cli serve``) with both as backends (eject after 5 failures for
  5 s, read timeout 2 s, stream idle timeout 1 s, no cache) and three routes over them —
  ``ordered``, ``weighted`` 3:1 and ``least_outstanding`` — each with 2 retries and fallback.

Beside them, for the sessions (loadtests/soak_sessions.py): ``gateway mock-upstream`` (a
route ``sessions`` for the realtime model ``rt-soak`` and every file purpose) and an MCP server
(the official SDK's ``MCPServer`` on uvicorn, ``tools``; with the built-in ``builtin``, both
behind ``/mcp``).

Then ``--clients`` asyncio clients (raw HTTP/1.1 over keep-alive loopback sockets, uvloop) send
requests for ``--duration`` seconds (600 at most), each choosing JSON or a stream, an answer
length, a route and a fault (the ``x-fault`` header, forwarded upstream): none, latency, reset
mid-body, timeout, slicer, limit_data, drip (faster and slower than the idle timeout), or a
status (400, 429, 500, 503); with a think time of up to ``--think-ms`` between requests. About
one turn in eight is a session instead: a realtime session over WebSocket, an MCP session
through ``/mcp`` (initialize, tools/list, tools/call, its end) or a file uploaded (multipart),
streamed back and deleted — each judged expected or unexpected (loadtests/soak_sessions.py).

Every answer is classified: a **full answer** (200 whose JSON or SSE content is exactly what the
upstream sent, a stream ending with ``data: [DONE]``), a **documented error** (400, 429, 500,
502, 503, 504 with an OpenAI-shaped error body — SPEC §5), or a cut stream ending with the
documented **SSE error event** (SPEC §8). Anything else — a connection closed without an answer,
a short or altered body, a stream that just stops, another status, no answer in 30 s — is
**unexpected**. An outcome the request's own fault cannot explain (a clean request answered 502,
say) is counted too: as a *race* when it is a 502 for an upstream connection that closed before
any answer byte (the upstream closes a connection after a ``limit_data`` answer; a request that
the pool hands that connection meanwhile fails — a documented 502, but one a pool that checks an
idle connection before reuse mostly avoids), otherwise as *unexplained*.

It prints requests, answers by kind, errors by kind, outcomes per fault asked, what the gateway
counted per backend (ejections, per-model ejections, retries, retry budget spent), what the
upstreams saw, and the gateway's RSS, open file descriptors and TCP connections
(``/proc/<pid>``) at the start (idle, after a warm-up), every minute under load and at the end
(idle again, clients gone).

Exit status: 0 when nothing was unexpected or unexplained (requests and sessions) and the
gateway exited 0 after SIGTERM,
1 otherwise, 2 for bad arguments. All traffic stays on 127.0.0.1; temp files live in one temp
dir that is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import uvloop

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from loadtests.soak_sessions import Sessions, SessionTally  # noqa: E402
from loadtests.soak_sessions import gateway_toml as sessions_toml  # noqa: E402
from tests.faults import expected_text  # noqa: E402  (what the fault upstream answers)
from tests.gateway_process import parse_head  # noqa: E402

MAX_DURATION_S = 600
CLIENT_TIMEOUT_S = 30.0
START_TIMEOUT_S = 20.0
#: (burst every, burst for) of the two upstreams: out of phase, so both rarely burst together
BURSTS = ((40.0, 2.0), (55.0, 2.0))
#: the gateway's backend settings (the faults' arguments are chosen around them)
BACKEND = (
    "eject_after = 5\neject_for_s = 5.0\nconnect_timeout_s = 1.0\n"
    "read_timeout_s = 2.0\nstream_idle_timeout_s = 1.0\n"
)
ROUTES = {
    "ordered": "",
    "weighted": 'strategy = "weighted"\nweights = [3, 1]\n',
    "least": 'strategy = "least_outstanding"\n',
}
DOCUMENTED_STATUS = frozenset({400, 429, 500, 502, 503, 504})
#: the codes of a 502 for an upstream connection that closed (FIN or RST) before any answer byte
RACE_CODES = frozenset({"upstream_disconnected", "upstream_reset"})

# ---------------------------------------------------------------- what a request asks for

#: fault kind -> (weight, allowed outcomes besides a 503 of a 5xx burst)
FAULTS: dict[str, tuple[int, frozenset[str]]] = {
    "none": (30, frozenset({"200"})),
    "latency": (10, frozenset({"200"})),
    "slicer": (8, frozenset({"200"})),
    "drip": (8, frozenset({"200"})),
    "drip>idle": (2, frozenset({"200", "504", "sse:upstream_stream_idle_timeout"})),
    "reset": (8, frozenset({"502", "sse:upstream_stream_truncated"})),
    "timeout": (4, frozenset({"504"})),
    "limit_data": (8, frozenset({"200", "502", "sse:upstream_stream_truncated"})),
    "status=400": (2, frozenset({"400"})),
    "status=429": (3, frozenset({"429"})),
    "status=500": (3, frozenset({"500"})),
    "status=503": (4, frozenset({"503"})),
}


@dataclass
class Ask:
    """One request: its fault, answer length, route and form."""

    fault: str
    header: str
    words: int
    route: str
    stream: bool
    #: the error message and code of an error answer
    message: str = ""
    code: str = ""

    @classmethod
    def pick(cls, rng: random.Random) -> Ask:
        kinds = list(FAULTS)
        fault = rng.choices(kinds, weights=[FAULTS[k][0] for k in kinds])[0]
        words = rng.randint(1, 64)
        arg = {
            "latency": f"latency={rng.randint(50, 500)}",
            "slicer": f"slicer={rng.randint(5, 64)}",
            "drip": f"drip={rng.randint(10, 60)}",
            "drip>idle": "drip=1500",
            "reset": "reset",
            "timeout": "timeout=5",
            "limit_data": f"limit_data={rng.randint(100, 800)}",
        }.get(fault, fault if fault.startswith("status") else "")
        header = ",".join(p for p in (arg, f"words={words}") if p)
        return cls(fault, header, words, rng.choice(list(ROUTES)), rng.random() < 0.5)

    def request(self, port: int) -> bytes:
        body = orjson.dumps(
            {
                "model": f"{self.route}-m",
                "messages": [{"role": "user", "content": "soak"}],
                **({"stream": True} if self.stream else {}),
            }
        )
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"x-fault: {self.header}\r\n\r\n"
        )
        return head.encode() + body


# ---------------------------------------------------------------- reading and judging answers


class Unexpected(Exception):
    """An outcome that is neither a full answer nor a documented error."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    close: bool


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        what = "closed before an answer" if not exc.partial else "closed in the answer's head"
        raise Unexpected(what) from None
    status, headers = parse_head(head)
    try:
        body = await _read_body(reader, headers)
    except (asyncio.IncompleteReadError, ValueError):
        raise Unexpected(f"{status} with a body cut short") from None
    close = headers.get("connection", "").lower() == "close"
    return Answer(status, headers, body, close)


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() != "chunked":
        raise Unexpected("an answer with neither content-length nor chunked framing")
    parts = []
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("bad chunk end")


def judge(ask: Ask, answer: Answer) -> tuple[str, str | None]:
    """The outcome (``200``, a status, ``sse:<error type>``) and the error type, if any;
    raises :class:`Unexpected` for anything that is neither an answer nor a documented error."""
    if answer.status == 200:
        return _judge_200(ask, answer)
    if answer.status not in DOCUMENTED_STATUS:
        raise Unexpected(f"status {answer.status}")
    try:
        error = orjson.loads(answer.body)["error"]
        kind = str(error["type"])
        assert isinstance(error["message"], str)
    except (orjson.JSONDecodeError, KeyError, TypeError, AssertionError):
        raise Unexpected(f"{answer.status} without an OpenAI-shaped error body") from None
    ask.message = str(error["message"])
    ask.code = str(error.get("code") or "")
    return str(answer.status), f"{kind} [{ask.code}]" if ask.code else kind


def _judge_200(ask: Ask, answer: Answer) -> tuple[str, str | None]:
    if not ask.stream:
        try:
            content = orjson.loads(answer.body)["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise Unexpected("200 JSON that does not parse as a completion") from None
        if content != expected_text(ask.words):
            raise Unexpected("200 JSON with altered content")
        return "200", None
    return _judge_stream(ask, answer)


def _judge_stream(ask: Ask, answer: Answer) -> tuple[str, str | None]:
    if not answer.headers.get("content-type", "").startswith("text/event-stream"):
        raise Unexpected("200 stream without text/event-stream")
    text: list[str] = []
    events = [e for e in answer.body.split(b"\n\n") if e.strip()]
    for i, event in enumerate(events):
        if not event.startswith(b"data: "):
            continue  # comments (keep-alives) and such
        if event == b"data: [DONE]":
            if i != len(events) - 1:
                raise Unexpected("200 stream with events after [DONE]")
            if "".join(text) != expected_text(ask.words):
                raise Unexpected("200 stream with altered content")
            return "200", None
        try:
            obj = orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            raise Unexpected("200 stream with an event that is not JSON") from None
        if "error" in obj:
            if i != len(events) - 1:
                raise Unexpected("200 stream with events after its error event")
            kind = str(obj["error"]["type"])
            return f"sse:{kind}", kind
        for choice in obj.get("choices", ()):
            text.append(choice.get("delta", {}).get("content") or "")
    raise Unexpected("200 stream that ends with neither [DONE] nor an error event")


# ---------------------------------------------------------------- the clients


@dataclass
class Tally:
    requests: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    by_fault: dict[str, Counter[str]] = field(default_factory=dict)
    unexpected: Counter[str] = field(default_factory=Counter)
    unexplained: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    connections: int = 0
    #: 502s of requests whose own fault cannot explain them, on a connection the upstream closed
    races: int = 0
    started: float = field(default_factory=time.monotonic)

    def note(self, ask: Ask, outcome: str, error: str | None) -> None:
        self.requests += 1
        form = "stream" if ask.stream else "JSON"
        if outcome == "200":
            self.answers[f"200 complete ({form})"] += 1
        elif outcome.startswith("sse:"):
            self.answers["200 stream cut: ends with the SSE error event"] += 1
        else:
            self.answers[f"{outcome} error answer"] += 1
        if error is not None:
            where = "SSE event" if outcome.startswith("sse:") else f"status {outcome}"
            self.errors[f"{error} ({where})"] += 1
        self.by_fault.setdefault(ask.fault, Counter())[outcome] += 1
        allowed = FAULTS[ask.fault][1]
        if outcome in allowed or outcome == "503":  # any request may meet a burst
            return
        if outcome == "502" and ask.code in RACE_CODES:
            self.races += 1
            return
        self.unexplained[f"{ask.fault} -> {outcome}"] += 1
        self.example(f"unexplained: {ask.header} stream={ask.stream} -> {outcome}: {ask.message}")

    def bad(self, ask: Ask, what: str) -> None:
        self.requests += 1
        self.unexpected[what] += 1
        self.by_fault.setdefault(ask.fault, Counter())["UNEXPECTED"] += 1
        self.example(f"unexpected: {ask.header} route={ask.route} stream={ask.stream}: {what}")

    def example(self, line: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(f"{time.monotonic() - self.started:6.1f} s  {line}")


async def client(
    port: int, seed: int, until: float, think_s: float, tally: Tally, sessions: Sessions
) -> None:
    rng = random.Random(seed)
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    try:
        while time.monotonic() < until:
            kind = sessions.pick(rng)
            if kind is not None:  # a session instead of a chat request this turn
                await sessions.run(kind, rng)
                await asyncio.sleep(rng.uniform(0, think_s))
                continue
            ask = Ask.pick(rng)
            if conn is None:
                conn = await asyncio.open_connection("127.0.0.1", port)
                tally.connections += 1
            reader, writer = conn
            keep = False
            try:
                writer.write(ask.request(port))
                async with asyncio.timeout(CLIENT_TIMEOUT_S):
                    answer = await read_answer(reader)
                outcome, error = judge(ask, answer)
                tally.note(ask, outcome, error)
                keep = not answer.close
            except Unexpected as exc:
                tally.bad(ask, str(exc))
            except TimeoutError:
                tally.bad(ask, f"no answer in {CLIENT_TIMEOUT_S:g} s")
            except (ConnectionError, OSError) as exc:
                tally.bad(ask, f"connection error: {type(exc).__name__}")
            except Exception as exc:  # an answer this client cannot even parse
                tally.bad(ask, f"unparsable answer: {type(exc).__name__}: {exc}")
            if not keep:
                _close(conn[1])
                conn = None
            await asyncio.sleep(rng.uniform(0, think_s))
    finally:
        if conn is not None:
            _close(conn[1])
        await sessions.aclose()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()


async def drive(
    port: int, clients: int, duration: float, think_s: float, seed: int, sample: Any
) -> tuple[Tally, SessionTally, list[tuple[str, Sample]]]:
    tally, sessions = Tally(), SessionTally()
    started = time.monotonic()
    until = started + duration
    tasks = [
        asyncio.create_task(
            client(port, seed * 100_003 + i, until, think_s, tally, Sessions(port, sessions))
        )
        for i in range(clients)
    ]
    samples: list[tuple[str, Sample]] = []
    while not all(t.done() for t in tasks):
        await asyncio.wait(tasks, timeout=min(60.0, duration / 2))
        if not all(t.done() for t in tasks):
            t = time.monotonic() - started
            samples.append((f"under load at {t:.0f} s ({tally.requests} requests)", sample()))
            print(
                f"  {t:5.0f} s  {tally.requests:8d} requests  "
                f"{sum(sessions.done.values()):6d} sessions  "
                f"unexpected {sum(tally.unexpected.values()) + sessions.total}",
                file=sys.stderr,
                flush=True,
            )
    for t in tasks:
        t.result()
    return tally, sessions, samples


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: nothing on 127.0.0.1:{port} after {START_TIMEOUT_S} s")


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM by PID, SIGKILL after 15 s; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


@contextlib.contextmanager
def started(args: list[str], port: int, log: Path, what: str) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, what)
        yield proc
    finally:
        stop(proc)


def gateway_toml(port: int, upstreams: list[int], mock: int, mcp: int) -> str:
    text = (
        f'[server]\nport = {port}\nshutdown_grace_s = 5\n\n[logging]\naccess_log = "off"\n'
        'level = "error"\n\n[cache]\nbackend = "off"\n\n'
    )
    for name, up in zip("ab", upstreams, strict=True):
        text += f'[[backends]]\nname = "{name}"\nurl = "http://127.0.0.1:{up}/v1"\n{BACKEND}\n'
    for route, extra in ROUTES.items():
        text += (
            f'[[routes]]\nname = "{route}"\nmodels = ["{route}-*"]\nbackends = ["a", "b"]\n'
            f"retries = 2\n{extra}\n"
        )
    return text + sessions_toml(mock, mcp)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def tcp_sockets(pid: int, port: int, upstreams: list[int]) -> tuple[int, int]:
    """The process's TCP connections: (to its clients on ``port``, to the ``upstreams``)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    clients = ups = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[9]) not in inodes or fields[3] == "0A":  # 0A: listening
                    continue
                local = int(fields[1].rsplit(":", 1)[1], 16)
                remote = int(fields[2].rsplit(":", 1)[1], 16)
                clients += local == port
                ups += remote in upstreams
    return clients, ups


@dataclass
class Sample:
    """The gateway process at one moment: RSS, open fds, and its TCP connections by peer."""

    rss_kb: int
    fds: int
    clients: int
    upstream: int
    #: the machine's 1-minute load average (other work on it shows here)
    load: float

    @classmethod
    def of(cls, pid: int, port: int, upstreams: list[int]) -> Sample:
        load = float(Path("/proc/loadavg").read_text().split()[0])
        return cls(rss_kb(pid), open_fds(pid), *tcp_sockets(pid, port, upstreams), load)

    def row(self, label: str) -> str:
        return (
            f"  {label:<44} {self.rss_kb / 1024:>8.1f} {self.fds:>8} {self.clients:>8} "
            f"{self.upstream:>8} {self.load:>6.2f}"
        )


class StallProbe(threading.Thread):
    """``GET /healthz`` every 0.2 s on a connection of its own: how long the gateway took to
    answer it — a gateway event loop that stalls (busy, or starved of CPU by the machine)
    shows here, and explains timeouts of 1 s that no fault asked for."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.done = threading.Event()
        self.started_at = time.monotonic()
        self.probes = self.failed = 0
        self.longest = 0.0
        #: (seconds since the start, seconds it took) of the answers slower than 0.5 s
        self.slow: list[tuple[float, float]] = []

    def run(self) -> None:
        url = f"http://127.0.0.1:{self.port}/healthz"
        while not self.done.wait(0.2):
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
            except OSError:
                self.failed += 1
                continue
            took = time.monotonic() - t0
            self.probes += 1
            self.longest = max(self.longest, took)
            if took > 0.5:
                self.slow.append((t0 - self.started_at, took))

    def summary(self) -> list[str]:
        over_1s = sum(1 for _, took in self.slow if took > 1.0)
        rows = [
            f"gateway /healthz every 0.2 s: {self.probes} answers, longest "
            f"{self.longest * 1000:.0f} ms, > 0.5 s: {len(self.slow)}, > 1 s: {over_1s}, "
            f"failed: {self.failed}"
        ]
        rows += [f"  at {t:6.1f} s it took {took * 1000:.0f} ms" for t, took in self.slow[:10]]
        return rows


def get_json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


def warm_up(port: int) -> None:
    """A few clean requests of each form and route and a session of each kind, so the start
    is measured warm."""

    async def main() -> None:
        for stream in (False, True):
            for route in ROUTES:
                for _ in range(5):
                    ask = Ask("none", "words=8", 8, route, stream)
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.write(ask.request(port))
                    judge(ask, await read_answer(reader))
                    _close(writer)
        tally = SessionTally()
        sessions = Sessions(port, tally)
        for kind in ("realtime", "mcp", "files"):
            await sessions.run(kind, random.Random(0))
        await sessions.aclose()
        if tally.total:
            raise RuntimeError(f"a warm-up session went wrong: {tally.examples}")

    asyncio.run(main())


def seen_by(log: Path) -> dict[str, int]:
    """What a fault upstream printed when it stopped (``faults: seen {...}``)."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("faults: seen "):
            return dict(json.loads(line.removeprefix("faults: seen ")))
    return {}


# ---------------------------------------------------------------- the table


def table(
    args: argparse.Namespace,
    tally: Tally,
    sessions: SessionTally,
    samples: list[tuple[str, Sample]],
    backends: dict[str, dict[str, Any]],
    seen: dict[str, dict[str, int]],
    exit_status: int,
    stalls: list[str],
) -> str:
    rows = [
        f"soak: {args.duration:g} s, {args.clients} clients, think <= {args.think_ms} ms, "
        f"seed {args.seed}"
    ]
    width = 66

    def row(label: str, value: object, indent: int = 2) -> None:
        rows.append(f"{' ' * indent}{label:<{width - indent}} {value:>10}")

    row("requests", tally.requests, 0)
    row("client connections opened", tally.connections, 0)
    rows.append("answers by kind")
    for kind, n in sorted(tally.answers.items()):
        row(kind, n)
    rows.append("errors by kind (error type, where the client saw it)")
    for kind, n in sorted(tally.errors.items()):
        row(kind, n)
    row("unexpected outcomes (must be 0)", sum(tally.unexpected.values()), 0)
    for kind, n in sorted(tally.unexpected.items()):
        row(kind, n)
    row("502 on a pooled connection the upstream had closed (race)", tally.races, 0)
    row(
        "other outcomes the fault asked cannot explain (must be 0)",
        sum(tally.unexplained.values()),
        0,
    )
    for kind, n in sorted(tally.unexplained.items()):
        row(kind, n)
    rows += sessions.rows()
    rows.append("outcomes per fault asked (200 = full answer, sse:* = cut stream's event)")
    for fault in FAULTS:
        counts = tally.by_fault.get(fault, Counter())
        spread = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        rows.append(f"  {fault:<12} {sum(counts.values()):>8}   {spread}")
    rows.append("gateway per backend (/readyz at the end)")
    for name, b in backends.items():
        rows.append(
            f"  {name}: ejections {b.get('ejections')}, model ejections "
            f"{b.get('model_ejections')}, retries {b.get('retries')}, retry budget spent "
            f"{b.get('budget_exhausted')}, state {b.get('state')}, models {b.get('models') or {}}"
        )
    rows.append("upstreams saw (by fault kind; burst = answered 503 by a 5xx burst)")
    for name, counts in seen.items():
        total = sum(counts.values())
        spread = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        rows.append(f"  {name}: {total} requests: {spread}")
    rows.append(
        "gateway process                               RSS MiB  open fds  clients  upstream  load"
    )
    rows += [sample.row(label) for label, sample in samples]
    rows += stalls
    row("gateway exit status after SIGTERM", exit_status, 0)
    if tally.examples:
        rows.append("examples")
        rows += [f"  {line}" for line in tally.examples]
    return "\n".join(rows)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of traffic (<= 600)")
    p.add_argument("--clients", type=int, default=300, help="concurrent clients")
    p.add_argument("--think-ms", type=int, default=100, help="max pause between two requests")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if not 0 < args.duration <= MAX_DURATION_S:
        p.error(f"--duration must be in (0, {MAX_DURATION_S}] s")
    if not 0 < args.clients <= 2000:
        p.error("--clients must be in [1, 2000]")
    return args


def run(args: argparse.Namespace, tmp: Path) -> int:
    ups = [free_port(), free_port()]
    gw_port, mock_port, mcp_port = free_port(), free_port(), free_port()
    config = tmp / "gateway.toml"
    config.write_text(gateway_toml(gw_port, ups, mock_port, mcp_port))
    faults = [
        [
            sys.executable,
            "-m",
            "tests.faults",
            "--port",
            str(port),
            "--burst-every",
            str(every),
            "--burst-for",
            str(length),
        ]
        for port, (every, length) in zip(ups, BURSTS, strict=True)
    ]
    gateway = [sys.executable, "-m", "gateway.cli", "serve", "-c", str(config)]
    mock = [sys.executable, "-m", "gateway.cli", "mock-upstream", "--port", str(mock_port)]
    mcp = [sys.executable, str(REPO / "loadtests/soak_sessions.py"), "--mcp-server", str(mcp_port)]
    logs = {"a": tmp / "a.log", "b": tmp / "b.log"}
    with (
        started(faults[0], ups[0], logs["a"], "fault upstream a"),
        started(faults[1], ups[1], logs["b"], "fault upstream b"),
        started(mock, mock_port, tmp / "mock.log", "mock upstream"),
        started(mcp, mcp_port, tmp / "mcp.log", "MCP server"),
        started(gateway, gw_port, tmp / "gateway.log", "gateway") as gw,
    ):
        warm_up(gw_port)
        time.sleep(0.5)  # the warm-up's connections closed on the gateway's side too

        def sample() -> Sample:
            return Sample.of(gw.pid, gw_port, ups)

        start = [("start (idle, after a warm-up)", sample())]
        print(f"soak: {args.clients} clients for {args.duration:g} s …", file=sys.stderr)
        probe = StallProbe(gw_port)
        probe.start()
        try:
            tally, sessions, samples = uvloop.run(
                drive(gw_port, args.clients, args.duration, args.think_ms / 1000, args.seed, sample)
            )
        finally:
            probe.done.set()
            probe.join(15)
        time.sleep(2)  # the clients are gone: let the gateway close their sockets
        samples = [*start, *samples, ("end (idle, clients gone)", sample())]
        backends = get_json(gw_port, "/readyz")["backends"]
        exit_status = stop(gw)
    seen = {}
    for name, log in logs.items():
        seen[name] = seen_by(log)
    print(table(args, tally, sessions, samples, backends, seen, exit_status, probe.summary()))
    bad = sum(tally.unexpected.values()) + sum(tally.unexplained.values()) + sessions.total
    return 0 if bad == 0 and exit_status == 0 else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        return run(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
