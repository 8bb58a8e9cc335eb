"""What a realtime session costs through the gateway (docs/spec.md §19): per-frame delay, CPU per
frame and memory per idle session. Prints markdown tables; not a test (no assertion on speed).

    python loadtests/realtime.py [--seconds 5] [--rounds 3] [--cores GW,LOAD] [--idle 1000]
                                 [--only SESSIONS:RATE ...] [--skip-idle] [--tree SRC]
                                 [--before SRC]

``--tree SRC`` runs the gateway of another source tree (e.g. a ``git worktree`` of an earlier
commit); ``--before SRC`` runs a second gateway from SRC beside it, measured in the same rounds
right before this one (rows marked "(before)"): a before/after under the same conditions.

The processes, each pinned with ``taskset`` (``--cores``; the machine needs two CPUs):

- on the gateway's CPU, alone: ``gateway serve`` (one worker), or in its place the **TCP
  forwarder**, a bare uvloop byte relay (no WebSocket, no Python per frame beyond one
  ``data_received`` → ``write``): what one more hop costs on this machine before any gateway code
  runs, the floor the gateway's added delay is to be read against; and the **WebSocket
  forwarder**, the same two hops with each message parsed and written again by ``websockets``'
  sans-I/O protocols in the read's callback and none of the gateway's code: what these libraries
  cost per frame, and the tail two WebSocket hops have here without the gateway (a round whose
  p99 is high for the gateway and both forwarders alike is the machine's, not the gateway's);
- on the load CPU: the **echo upstream** and the **client**, each its own process, both
  ``websockets``' sans-I/O protocol on uvloop with no task per message (the echo writes each
  frame back in the ``data_received`` that read it), so neither is the bottleneck: the direct
  rows show what they cost on their own.

The client opens its sessions first, then sends timestamped text messages (``{"type":…}``, 220
bytes) at a fixed total rate, round robin over the sessions, and stamps each echo in the
``data_received`` that read it (``time.perf_counter()`` right after the socket read). A message
crosses the relay twice (client → upstream and back), so the delay the relay adds per frame is
half the difference of the round trips, taken per percentile. Each configuration runs
``--rounds`` rounds, each round direct, then through the TCP forwarder, the WebSocket
forwarder, then through the gateway(s), back to back; the table shows the best round (the
lowest added p50: the least disturbed, as other load only ever slows a round down), the spread
of the added delay over all rounds, since other people share the machine, and each round's added
p99 through the gateway and both forwarders side by side (the tail is where one sees whose it
is).

Beside it, the gateway's own reading of the same thing: its
``gateway_realtime_message_overhead_seconds`` histogram (read → written, per message and
direction) scraped before and after the round, as bucket bounds (p50 ≤ 0.1 ms shows as
"≤ 0.1") and the exact mean (sum / count); and its CPU time per frame relayed (every thread's,
from ``/proc/PID/task/*/schedstat``, in ns).

Rows: one session at 100 and 1,000 messages/s; 200 concurrent sessions at 100 and 1,000
messages/s in total. The CPU and the histogram are read around the paced part only (the client
says when its sessions are open and when the last echo is back), so handshakes and closes are
not in them. And RSS, measured first on the fresh gateway (so no memory freed by earlier
sessions is reused): its resident memory before and after ``--idle`` sessions are opened and
left idle, per session.

Targets: added per-frame p50 ≤ 0.1 ms and p99 ≤ 1 ms on one core; ≤ 50 KiB RSS per
idle session.

Internal modes (what the processes above run): ``--echo PORT``, ``--forward PORT TARGET_PORT``,
``--client URL SESSIONS RATE SECONDS`` (prints the round trips as JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()

CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
[[backends]]
name = "echo"
url = "http://127.0.0.1:{upstream}/v1"
[[routes]]
models = ["*"]
backends = ["echo"]
[logging]
access_log = "off"
level = "warning"
[ui]
enabled = false
"""

#: every message: an event a client could send, 220 bytes with its sequence number
PAD_B = b"x" * 180
CONFIGS = ((1, 100), (1, 1000), (200, 100), (200, 1000))


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# ---------------------------------------------------------------- the echo upstream


def write_out(ws: Any, transport: Any) -> None:
    """What a sans-I/O ``websockets`` protocol has to send, written (an empty chunk: close)."""
    for chunk in ws.data_to_send():
        if chunk:
            transport.write(chunk)
        else:
            transport.close()


def echo_main(port: int) -> None:
    """A realtime upstream that echoes every message in the read that completed it."""
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Request
    from websockets.server import ServerProtocol

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.ws = ServerProtocol(max_size=None)

        def data_received(self, data: bytes) -> None:
            ws = self.ws
            ws.receive_data(data)
            for event in ws.events_received():
                if type(event) is Frame:
                    if event.opcode is Opcode.TEXT:
                        ws.send_text(event.data)
                    elif event.opcode is Opcode.BINARY:
                        ws.send_binary(event.data)
                elif isinstance(event, Request):
                    ws.send_response(ws.accept(event))
            self.flush()

        def eof_received(self) -> None:
            self.ws.receive_eof()
            self.flush()

        def flush(self) -> None:
            write_out(self.ws, self.transport)

    loop = new_loop()
    loop.run_until_complete(loop.create_server(Echo, "127.0.0.1", port, backlog=4096))
    loop.run_forever()


# ---------------------------------------------------------------- the TCP forwarder (the floor)


def forward_main(port: int, target: int) -> None:
    """Every connection relayed byte for byte to 127.0.0.1:target, in the read's callback."""

    class Side(asyncio.Protocol):
        peer: Side | None = None
        transport: Any = None

        def __init__(self) -> None:
            self.pending: list[bytes] = []

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            peer = self.peer
            if peer is not None and peer.transport is not None:
                peer.transport.write(data)
            else:
                self.pending.append(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.peer is not None and self.peer.transport is not None:
                self.peer.transport.close()

    dialing: set[asyncio.Task[None]] = set()

    class Inbound(Side):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            task = asyncio.get_running_loop().create_task(self.dial())
            dialing.add(task)
            task.add_done_callback(dialing.discard)

        async def dial(self) -> None:
            loop = asyncio.get_running_loop()
            _, out = await loop.create_connection(Side, "127.0.0.1", target)
            out.peer, self.peer = self, out
            for data in self.pending:  # what the client sent meanwhile
                out.transport.write(data)
            self.pending.clear()

    loop = new_loop()
    loop.run_until_complete(loop.create_server(Inbound, "127.0.0.1", port, backlog=4096))
    loop.run_forever()


# ---------------------------------------------------------------- the WebSocket forwarder


class ForwardHop(asyncio.Protocol):
    """One side of the WebSocket forwarder: ``websockets``' sans-I/O protocol over one socket;
    each message read is written by the other side in the same callback."""

    peer: ForwardHop | None = None
    transport: Any = None

    def __init__(self, ws: Any, target: int) -> None:
        self.ws, self.target = ws, target
        self.pending: list[Any] = []  # frames read before the other side was open

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        from websockets.frames import Frame, Opcode
        from websockets.http11 import Request

        ws = self.ws
        ws.receive_data(data)
        for event in ws.events_received():
            if type(event) is Frame:
                if event.opcode is Opcode.TEXT or event.opcode is Opcode.BINARY:
                    peer = self.peer
                    if peer is not None and peer.peer is self:
                        peer.relay(event)
                    else:
                        self.pending.append(event)
            elif isinstance(event, Request):  # the client's handshake: accepted at once
                ws.send_response(ws.accept(event))
                asyncio.get_running_loop().create_task(self.dial())
            elif self.peer is not None:  # the upstream's handshake response
                self.peer.peer = self
                for frame in self.peer.pending:
                    self.relay(frame)
        self.flush()

    def relay(self, frame: Any) -> None:
        from websockets.frames import Opcode

        if frame.opcode is Opcode.TEXT:
            self.ws.send_text(frame.data)
        else:
            self.ws.send_binary(frame.data)
        self.flush()

    async def dial(self) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        uri = parse_uri(f"ws://127.0.0.1:{self.target}/v1/realtime")
        up = ForwardHop(ClientProtocol(uri, max_size=None), self.target)
        up.peer = self
        await asyncio.get_running_loop().create_connection(lambda: up, "127.0.0.1", self.target)
        up.ws.send_request(up.ws.connect())
        up.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def flush(self) -> None:
        write_out(self.ws, self.transport)


def ws_forward_main(port: int, target: int) -> None:
    """A bare WebSocket relay: each message parsed and written again by ``websockets``' sans-I/O
    protocols (a server one facing the client, a client one facing 127.0.0.1:target), in the
    read's callback, with none of the gateway's code: what these libraries cost per frame on
    this machine, and what tail the same two hops have without the gateway."""
    from websockets.server import ServerProtocol

    loop = new_loop()
    hop = lambda: ForwardHop(ServerProtocol(max_size=None), target)  # noqa: E731
    loop.run_until_complete(loop.create_server(hop, "127.0.0.1", port, backlog=4096))
    loop.run_forever()


# ---------------------------------------------------------------- the client


def client_main(url: str, sessions: int, rate: float, seconds: float) -> None:
    """Open ``sessions`` sessions, say ``open`` and wait for a line on stdin, send ``rate``
    messages/s in total for ``seconds``, say ``sent`` (the last echoes are back) and wait for a
    line again, close the sessions, print the round trips (seconds) as JSON. The lines let the
    caller read the relay's CPU and histogram around the paced part only."""
    loop = new_loop()
    asyncio.set_event_loop(loop)
    out = loop.run_until_complete(_client(url, sessions, rate, seconds))
    print(json.dumps(out), flush=True)


def _told(word: str) -> None:
    print(word, flush=True)
    sys.stdin.readline()


class Tally:
    """The client's send stamps and round trips, over all its sessions."""

    def __init__(self) -> None:
        self.sent: dict[int, float] = {}
        self.rtts: list[float] = []
        self.echoed = asyncio.Event()  # every message sent so far came back


class BenchSession(asyncio.Protocol):
    """One client session: ``websockets``' sans-I/O client protocol, no task per message."""

    def __init__(self, uri: Any, tally: Tally) -> None:
        from websockets.client import ClientProtocol

        self.ws = ClientProtocol(uri, max_size=None)
        self.tally = tally
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.ws.send_request(self.ws.connect())
        self.flush()

    def data_received(self, data: bytes) -> None:
        from websockets.frames import Frame, Opcode

        now = time.perf_counter()  # at the socket read
        ws, tally = self.ws, self.tally
        ws.receive_data(data)
        for event in ws.events_received():
            if type(event) is Frame:
                if event.opcode is Opcode.TEXT:
                    tail = bytes(event.data[-14:])
                    seq = int(tail[tail.rindex(b":") + 1 : -1])
                    tally.rtts.append(now - tally.sent.pop(seq))
                    if not tally.sent:
                        tally.echoed.set()
            elif not self.opened.done():  # the handshake's response
                status = getattr(event, "status_code", 0)
                if status == 101:
                    self.opened.set_result(None)
                else:
                    self.opened.set_exception(RuntimeError(f"handshake answered {status}"))
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed during the handshake"))

    def send(self, seq: int) -> None:
        self.ws.send_text(b'{"type":"input_text.bench","pad":"%s","n":%d}' % (PAD_B, seq))
        self.tally.sent[seq] = time.perf_counter()  # right before the socket write
        self.tally.echoed.clear()
        self.flush()

    def flush(self) -> None:
        write_out(self.ws, self.transport)


async def _client(url: str, sessions: int, rate: float, seconds: float) -> dict[str, Any]:
    from websockets.uri import parse_uri

    loop = asyncio.get_running_loop()
    uri = parse_uri(url)
    tally = Tally()
    opened: list[BenchSession] = []
    for i in range(0, sessions, 50):  # open them all first, 50 at a time
        batch = await asyncio.gather(
            *(
                loop.create_connection(lambda: BenchSession(uri, tally), uri.host, uri.port)
                for _ in range(min(50, sessions - i))
            )
        )
        for _, session in batch:
            await asyncio.wait_for(session.opened, 30)
            opened.append(session)
    _told("open")
    start = time.perf_counter() + 0.05
    for seq in range(int(rate * seconds)):  # paced, round robin over the sessions
        delay = start + seq / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        opened[seq % sessions].send(seq)
    with contextlib.suppress(TimeoutError):  # the last echoes
        await asyncio.wait_for(tally.echoed.wait(), 2.0)
    _told("sent")
    for session in opened:
        session.ws.send_close(1000)
        session.flush()
    await asyncio.sleep(0.05)
    for session in opened:
        session.transport.abort()
    return {"rtts": tally.rtts, "lost": len(tally.sent)}


# ---------------------------------------------------------------- measuring


def taskset(cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu] if cpu is not None else []


class Window:
    """What the relay did between the client's ``open`` and ``sent``: CPU (ns) and /metrics."""

    def __init__(self, pid: int | None = None, metrics_port: int | None = None) -> None:
        self.pid, self.port = pid, metrics_port
        self.cpu = 0
        self.before = self.after = ""

    def start(self) -> None:
        if self.port is not None:
            self.before = metrics_text(self.port)
        if self.pid is not None:
            self.cpu = -cpu_ns(self.pid)

    def stop(self) -> None:
        if self.pid is not None:
            self.cpu += cpu_ns(self.pid)
        if self.port is not None:
            self.after = metrics_text(self.port)


def run_client(
    cpu: str | None,
    url: str,
    sessions: int,
    rate: float,
    seconds: float,
    window: Window | None = None,
) -> list[float]:
    cmd = [*taskset(cpu), sys.executable, str(HERE), "--client", url, str(sessions), str(rate)]
    proc = subprocess.Popen(
        [*cmd, str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    window = window or Window()
    try:
        for word, step in (("open", window.start), ("sent", window.stop)):
            line = proc.stdout.readline().strip()
            if line != word:
                raise RuntimeError(f"the client said {line!r} against {url}, not {word!r}")
            step()
            proc.stdin.write("\n")
            proc.stdin.flush()
        out = json.loads(proc.stdout.readline())
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()  # ours, by handle
            proc.wait()
    if out["lost"]:
        print(f"  ({out['lost']} messages without an echo at {url})", file=sys.stderr)
    return list(out["rtts"])


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process (ns)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metrics_text(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def overhead_histogram(before: str, after: str) -> tuple[str, str, str]:
    """p50, p99 (bucket bounds) and mean (ms) of the observations between two scrapes."""
    from prometheus_client.parser import text_string_to_metric_families

    def read(text: str) -> tuple[dict[float, float], float, float]:
        buckets: dict[float, float] = {}
        total = count = 0.0
        for family in text_string_to_metric_families(text):
            if family.name == "gateway_realtime_message_overhead_seconds":
                for s in family.samples:
                    if s.name.endswith("_bucket"):
                        le = float(s.labels["le"])
                        buckets[le] = buckets.get(le, 0.0) + s.value
                    elif s.name.endswith("_sum"):
                        total += s.value
                    elif s.name.endswith("_count"):
                        count += s.value
        return buckets, total, count

    (b, bsum, bcount), (a, asum, acount) = read(before), read(after)
    diff = {le: a[le] - b.get(le, 0.0) for le in a}
    if not diff or diff[max(diff)] <= 0:
        return "-", "-", "-"
    total = diff[max(diff)]

    def q(p: float) -> str:
        for le in sorted(diff):
            if diff[le] >= p * total:
                return "≤ " + f"{le * 1000:g}"
        return "-"

    mean = (asum - bsum) / (acount - bcount) * 1000 if acount > bcount else 0.0
    return q(0.5), q(0.99), f"{mean:.3f}"


class Relayed:
    """One gateway's part of a round: round trips, histogram, CPU per frame."""

    __slots__ = ("cpu_per_frame_us", "hist", "rtts")

    def __init__(self, rtts: list[float], hist: tuple[str, str, str], cpu_us: float) -> None:
        self.rtts, self.hist, self.cpu_per_frame_us = rtts, hist, cpu_us


class Round:
    __slots__ = (
        "direct",
        "forward",
        "forward_cpu_us",
        "gateways",
        "ws_forward",
        "ws_forward_cpu_us",
    )

    def __init__(self) -> None:
        self.direct: list[float] = []
        self.forward: list[float] = []
        self.forward_cpu_us = 0.0
        self.ws_forward: list[float] = []
        self.ws_forward_cpu_us = 0.0
        #: label ("" for this tree, "before" for --before) -> what that gateway did
        self.gateways: dict[str, Relayed] = {}

    def added(self, which: list[float], p: float) -> float:
        """ms added per frame: half the round trip's difference to direct."""
        return (pct(which, p) - pct(self.direct, p)) / 2 * 1000


def ms2(values: list[float]) -> str:
    return f"{pct(values, 50) * 1000:.3f} / {pct(values, 99) * 1000:.3f}"


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} to {max(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def measure(
    args: argparse.Namespace, ports: dict[str, int], pids: dict[str, int], sessions: int, rate: int
) -> list[Round]:
    """``--rounds`` rounds, each: direct, the TCP forwarder, the WebSocket forwarder, then each
    gateway, back to back."""
    load = args.load_cpu

    def url(port: int) -> str:
        return f"ws://127.0.0.1:{port}/v1/realtime?model=bench"

    rounds = []
    for _ in range(args.rounds):
        r = Round()
        r.direct = run_client(load, url(ports["echo"]), sessions, rate, args.seconds)
        fw = Window(pids["forward"])
        r.forward = run_client(load, url(ports["forward"]), sessions, rate, args.seconds, fw)
        r.forward_cpu_us = fw.cpu / 1000 / max(1, 2 * len(r.forward))
        wf = Window(pids["ws_forward"])
        r.ws_forward = run_client(load, url(ports["ws_forward"]), sessions, rate, args.seconds, wf)
        r.ws_forward_cpu_us = wf.cpu / 1000 / max(1, 2 * len(r.ws_forward))
        for label in ("before", ""):
            if label not in pids:
                continue
            port = ports[label]
            gw = Window(pids[label], port)
            rtts = run_client(load, url(port), sessions, rate, args.seconds, gw)
            # frames relayed: each message both ways (the paced part only: no handshakes)
            cpu = gw.cpu / 1000 / max(1, 2 * len(rtts))
            r.gateways[label] = Relayed(rtts, overhead_histogram(gw.before, gw.after), cpu)
        rounds.append(r)
    return rounds


def rows(sessions: int, rate: int, rounds: list[Round]) -> list[str]:
    out = []
    for label in rounds[0].gateways:
        best = min(rounds, key=lambda r: r.added(r.gateways[label].rtts, 50))
        g = best.gateways[label]
        cells = [
            f"{sessions} session{'s' if sessions > 1 else ''}" + (f" ({label})" if label else ""),
            f"{rate:,}",
            str(len(g.rtts)),
            ms2(best.direct),
            f"{best.added(best.forward, 50):.3f} / {best.added(best.forward, 99):.3f}",
            f"{best.added(best.ws_forward, 50):.3f} / {best.added(best.ws_forward, 99):.3f}",
            ms2(g.rtts),
            f"**{best.added(g.rtts, 50):.3f} / {best.added(g.rtts, 99):.3f}**",
            spread([r.added(r.gateways[label].rtts, 50) for r in rounds])
            + " / "
            + spread([r.added(r.gateways[label].rtts, 99) for r in rounds]),
            "; ".join(
                f"{r.added(r.gateways[label].rtts, 99):.2f} / {r.added(r.ws_forward, 99):.2f}"
                f" / {r.added(r.forward, 99):.2f}"
                for r in rounds
            ),
            " / ".join(g.hist),
            f"{g.cpu_per_frame_us:.1f} ({best.ws_forward_cpu_us:.1f} / {best.forward_cpu_us:.1f})",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


HEADER = (
    "| sessions | msg/s (total) | messages | direct RTT p50 / p99 ms"
    " | TCP forwarder adds p50 / p99 ms | WebSocket forwarder adds p50 / p99 ms"
    " | via gateway RTT p50 / p99 ms | gateway adds per frame p50 / p99 ms"
    " | spread over rounds p50 / p99 ms | p99 added each round: gateway / WS fwd / TCP fwd ms"
    " | gateway histogram p50 / p99 / mean ms"
    " | CPU µs / frame: gateway (WS forwarder / TCP forwarder) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


async def idle_rss(url: str, pid: int, count: int) -> tuple[int, int]:
    from websockets.asyncio.client import connect

    before = rss_kib(pid)
    sockets = []
    try:
        for i in range(0, count, 50):
            batch = await asyncio.gather(
                *(
                    connect(url, compression=None, open_timeout=60, ping_interval=None)
                    for _ in range(min(50, count - i))
                )
            )
            sockets.extend(batch)
        await asyncio.sleep(1.0)
        after = rss_kib(pid)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return before, after


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per round and target")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", default="0,1", help="GATEWAY_CPU,LOAD_CPU ('' not to pin)")
    parser.add_argument("--only", action="append", default=[], help="SESSIONS:RATE (repeat)")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--tree", default=str(ROOT), help="the source tree whose gateway to run")
    parser.add_argument(
        "--before", help="also run this source tree's gateway, measured in the same rounds"
    )
    parser.add_argument("--echo", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--forward", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--ws-forward", type=int, nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    raise_fd_limit()
    if args.echo is not None:
        echo_main(args.echo)
        return 0
    if args.forward is not None:
        forward_main(*args.forward)
        return 0
    if args.ws_forward is not None:
        ws_forward_main(*args.ws_forward)
        return 0
    if args.client is not None:
        url, sessions, rate, seconds = args.client
        client_main(url, int(sessions), float(rate), float(seconds))
        return 0
    return bench(args)


def start_gateway(args: argparse.Namespace, tree: str, port: int, echo: int, tmp: str) -> Any:
    cfg = Path(tmp) / f"gateway-{port}.toml"
    cfg.write_text(CONFIG.format(port=port, upstream=echo))
    return subprocess.Popen(
        [
            *taskset(args.gateway_cpu),
            *[sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)],
        ],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": tree},
    )


def bench(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    from tests.support import free_port, wait_port

    # stopped with SIGTERM: still stop what it started (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    cores = [c for c in args.cores.split(",") if c]
    if len(cores) == 2 and (os.cpu_count() or 1) >= 2:
        args.gateway_cpu, args.load_cpu = cores
        os.sched_setaffinity(0, {int(args.load_cpu)})  # this process (idle RSS) too
    else:
        print("warning: not pinned (needs --cores GW,LOAD and two CPUs)", file=sys.stderr)
        args.gateway_cpu = args.load_cpu = None
    configs = [tuple(int(x) for x in o.split(":")) for o in args.only] or list(CONFIGS)
    trees = {"": args.tree, **({"before": args.before} if args.before else {})}
    ports = {"echo": free_port(), "forward": free_port(), "ws_forward": free_port()}
    ports.update({k: free_port() for k in trees})
    procs: list[Any] = []
    me = [sys.executable, str(HERE)]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            procs.append(
                subprocess.Popen([*taskset(args.load_cpu), *me, "--echo", str(ports["echo"])])
            )
            fwd = [*me, "--forward", str(ports["forward"]), str(ports["echo"])]
            procs.append(subprocess.Popen([*taskset(args.gateway_cpu), *fwd]))
            pids = {"forward": procs[-1].pid}
            wsf = [*me, "--ws-forward", str(ports["ws_forward"]), str(ports["echo"])]
            procs.append(subprocess.Popen([*taskset(args.gateway_cpu), *wsf]))
            pids["ws_forward"] = procs[-1].pid
            for label, tree in trees.items():
                procs.append(start_gateway(args, tree, ports[label], ports["echo"], tmp))
                pids[label] = procs[-1].pid
            for port in ports.values():
                wait_port(port, 30)
            idle: dict[str, tuple[int, int]] = {}
            for label in trees:
                via = f"ws://127.0.0.1:{ports[label]}/v1/realtime?model=bench"
                run_client(args.load_cpu, via, 4, 200, 1.0)  # warm up (imports, first sessions)
                if not args.skip_idle:  # first, while it has no memory of many sessions to reuse
                    idle[label] = asyncio.run(idle_rss(via, pids[label], args.idle))
            lines = []
            for sessions, rate in configs:
                lines.extend(rows(sessions, rate, measure(args, ports, pids, sessions, rate)))
                print("\n".join(lines[-len(trees) :]), file=sys.stderr)
            named = ", ".join(f"{k or 'this'}: {v}" for k, v in trees.items())
            print(
                f"\nrealtime relay ({named}): gateways on CPU {args.gateway_cpu or 'any'}, echo"
                f" upstream and client on CPU {args.load_cpu or 'any'}; best of {args.rounds}"
                f" rounds of {args.seconds:g} s per target"
            )
            print(HEADER)
            for line in lines:
                print(line)
            if idle:
                print("\n| gateway | idle sessions | RSS before | after | per session |")
                print("|---|---|---|---|---|")
                for label, (before, after) in idle.items():
                    per = (after - before) / args.idle
                    name = label or "this"
                    print(
                        f"| {name} | {args.idle} | {before:,} KiB | {after:,} KiB | {per:.1f} KiB |"
                    )
        finally:
            for p in reversed(procs):  # ours, by handle
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
