#!/usr/bin/env python3
"""Can the gateway read the kernel's receive timestamp (``SO_TIMESTAMPNS``) cheaply? (issue 41,
item 4; docs/spec.md §6). Prints what each way of reading it costs per request, on loopback TCP.

    python loadtests/rx_stamp.py [--n 20000]

The kernel stamps every arriving packet when ``SO_TIMESTAMPNS`` is on; for TCP the stamp reaches
user space only as ancillary data of the ``recvmsg`` that reads the bytes (``SIOCGSTAMPNS`` is for
datagram sockets: on a TCP socket it fails with ENOENT, checked below). uvloop's (and asyncio's)
transports read with ``recv``/``read`` and drop nothing but also ask for nothing, so the stamp of
the bytes they hand to ``data_received`` is gone. What is measured:

- ``recv`` vs ``recvmsg`` with room for the stamp: what reading the stamp would cost if the
  gateway did its own reads (its own transport);
- the peek dance a protocol could do on a ``socket.fromfd`` duplicate beside uvloop's transport:
  ``pause_reading`` + ``add_reader`` on the duplicate, on readiness ``recvmsg(MSG_PEEK)`` for the
  stamp, ``remove_reader`` + ``resume_reading`` — per request (its first read);
- the wait the stamp would show: kernel stamp → ``data_received`` at c=1, idle loop.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import fcntl
import socket
import statistics
import struct
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SIOCGSTAMPNS = 0x8907
SPACE = socket.CMSG_SPACE(16)
PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


def pair() -> tuple[socket.socket, socket.socket]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    srv.close()
    for x in (c, s):
        x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return c, s


def per_call_us(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def blocking_costs(n: int) -> list[tuple[str, str]]:
    c, s = pair()
    rows = []
    send = c.send
    recv = s.recv
    recvmsg = s.recvmsg
    base = per_call_us(lambda: (send(b"y"), recv(4096)), n)
    with_stamp = per_call_us(lambda: (send(b"y"), recvmsg(4096, SPACE)), n)
    rows.append(("send + recv (µs)", f"{base:.2f}"))
    rows.append(("send + recvmsg with the stamp (µs)", f"{with_stamp:.2f}"))
    rows.append(("the stamp's cost on an own read (µs)", f"{with_stamp - base:+.2f}"))
    send(b"z")
    time.sleep(0.01)
    recv(4096)
    try:
        fcntl.ioctl(s.fileno(), SIOCGSTAMPNS, b"\0" * 16)
        rows.append(("SIOCGSTAMPNS after recv on TCP", "works"))
    except OSError as exc:
        rows.append(("SIOCGSTAMPNS after recv on TCP", errno.errorcode.get(exc.errno or 0, "?")))
    c.close()
    s.close()
    return rows


class _Echo(asyncio.Protocol):
    def __init__(self, n: int, peek: bool) -> None:
        self.n = n
        self.peek = peek
        self.lags: list[float] = []
        self.done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.count = 0
        self.t0 = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.dup = socket.fromfd(sock.fileno(), socket.AF_INET, socket.SOCK_STREAM)
        self.dup.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.loop = asyncio.get_running_loop()
        self.t0 = time.perf_counter()
        if self.peek:
            self._watch()

    def _watch(self) -> None:
        self.transport.pause_reading()
        self.loop.add_reader(self.dup.fileno(), self._ready)

    def _ready(self) -> None:
        try:
            _, anc, _, _ = self.dup.recvmsg(1, SPACE, PEEK)
        except OSError:  # the peer closed: readiness with nothing to peek
            anc = []
        now = time.time_ns()
        for _, _, data in anc:
            sec, ns = struct.unpack("qq", data[:16])
            self.lags.append((now - (sec * 10**9 + ns)) / 1000)
        self.loop.remove_reader(self.dup.fileno())
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"k")
        self.count += 1
        if self.count >= self.n:
            self.done.set_result(time.perf_counter() - self.t0)
        elif self.peek:
            self._watch()


async def loop_costs(n: int) -> list[tuple[str, str]]:
    loop = asyncio.get_running_loop()
    rows = []
    per_req = {}
    for peek in (False, True):
        proto: list[_Echo] = []
        server = await loop.create_server(
            lambda p=peek, made=proto: made.append(_Echo(n, p)) or made[-1], "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            w.write(b"q")
            await r.readexactly(1)
        secs = await proto[0].done
        per_req[peek] = secs / n * 1e6
        if peek and proto[0].lags:
            rows.append(
                (
                    "kernel stamp → peek callback, c=1 (µs p50)",
                    f"{statistics.median(proto[0].lags):.1f}",
                )
            )
        w.close()
        server.close()
    rows.insert(
        0, ("round trip, transport only (µs, both sides on this loop)", f"{per_req[False]:.2f}")
    )
    rows.insert(1, ("round trip with the peek dance (µs)", f"{per_req[True]:.2f}"))
    rows.insert(
        2, ("the peek dance's cost per request (µs)", f"{per_req[True] - per_req[False]:+.2f}")
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    try:
        import uvloop

        new_loop = uvloop.new_event_loop
        name = f"uvloop {uvloop.__version__}"
    except ImportError:
        new_loop = asyncio.new_event_loop
        name = "asyncio"
    rows = blocking_costs(args.n)
    loop = new_loop()
    try:
        rows += loop_costs_rows(loop, args.n)
    finally:
        loop.close()
    print(f"## Kernel receive stamps ({name}, loopback TCP, n={args.n})\n")
    print("| what | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")


def loop_costs_rows(loop: asyncio.AbstractEventLoop, n: int) -> list[tuple[str, str]]:
    return loop.run_until_complete(loop_costs(n))


if __name__ == "__main__":
    main()
