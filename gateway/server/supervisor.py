"""``workers > 1``: the parent process of ``gateway serve``, which serves nothing itself.

It binds the socket once (:func:`gateway.server.process.serve` did) and starts the worker
processes (``python -m gateway.server.worker``), each inheriting the bound socket
(``pass_fds``; with ``[admin] listen``, the admin API's socket too: ``--admin-fd``) and the
environment ``gateway serve`` set (the config path and the CLI overrides, the live view's
secret, the metrics directory made here), and each running a
:class:`gateway.server.process.Server` on the sockets: the kernel hands each new connection to
one of the workers accepting on it.

- SIGTERM or SIGINT: the parent closes its own copy of the socket at once, sends SIGTERM to
  every worker (each drains as a single process does; a Ctrl+C at a terminal reaches the
  workers too, and one SIGINT plus one SIGTERM is still one drain), waits for them and exits 0
  — or :data:`STARTUP_FAILURE` when a worker could not start. A second SIGINT is passed on as
  SIGINT: the workers cancel what is left.
- SIGHUP (with ``[server.tls]``): passed on to every worker, which re-reads the certificate.
- a worker whose app could not start (exit status 3) stops them all: a startup that failed once
  fails again. A worker that ends otherwise while nothing asked it to (killed, crashed) is
  replaced by a new one.
- SIGHUP is passed on to every worker: each reads the config file again (docs/spec.md §29).
  A worker starts with SIGHUP blocked until its app has started, so one that is starting is
  never stopped by it, and a reload asked meanwhile is held and run once it has started.
- the workers hold the read end of a pipe whose write end only the parent holds: if the parent
  is killed outright (SIGKILL), the pipe closes and each worker drains and exits on its own.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from types import FrameType

log = logging.getLogger("gateway")

#: the exit status of a process whose app could not start (uvicorn's convention, kept): a
#: worker's tells the supervisor to stop them all, and it is the supervisor's own then
STARTUP_FAILURE = 3
#: how often the parent looks at its workers (a worker's end is seen this late at most)
POLL_S = 0.1


class Supervisor:
    """The worker processes on one bound socket (see the module)."""

    def __init__(
        self,
        sock: socket.socket,
        workers: int,
        command: list[str] | None = None,
        *,
        admin_sock: socket.socket | None = None,
    ) -> None:
        self.sock = sock
        #: ``[admin] listen``'s bound socket, passed on as the main one is (``--admin-fd``)
        self.admin_sock = admin_sock
        self.count = workers
        #: the worker's command line (tests start a stand-in); the fds are appended to it
        self.command = command or [sys.executable, "-m", "gateway.server.worker"]
        self.workers: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        self.failed = False
        self._pipe: tuple[int, int] | None = None

    def run(self) -> int:
        """Until the workers are gone: 0, or STARTUP_FAILURE when one could not start."""
        from gateway.telemetry.metrics import METRICS_DIR_ENV

        handled = (signal.SIGTERM, signal.SIGINT)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_reload)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})  # held by serve() until here
        # the workers' metrics snapshots, merged by whichever worker answers /metrics
        with tempfile.TemporaryDirectory(prefix="gateway-metrics-") as shared:
            os.environ[METRICS_DIR_ENV] = shared
            self._pipe = os.pipe()  # both ends non-inheritable: each worker gets the read end
            try:
                for _ in range(self.count):
                    self._start()
                self._watch()
            finally:
                for fd in self._pipe:
                    os.close(fd)
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        return STARTUP_FAILURE if self.failed else 0

    def _start(self) -> None:
        assert self._pipe is not None
        listen, parent = self.sock.fileno(), self._pipe[0]
        args = ["--listen-fd", str(listen), "--parent-fd", str(parent)]
        fds = [listen, parent]
        if self.admin_sock is not None:
            args += ["--admin-fd", str(self.admin_sock.fileno())]
            fds.append(self.admin_sock.fileno())
        worker = subprocess.Popen(
            [*self.command, *args],
            pass_fds=fds,
            preexec_fn=_hold_sighup,  # the supervisor runs no thread: fork-safe here
        )
        self.workers.append(worker)
        if self.stopping:  # a signal came while it was being started
            worker.send_signal(signal.SIGTERM)

    def _watch(self) -> None:
        while self.workers:
            time.sleep(POLL_S)
            for worker in list(self.workers):
                status = worker.poll()
                if status is None:
                    continue
                self.workers.remove(worker)
                if self.stopping:
                    continue
                if status == STARTUP_FAILURE:
                    log.error(f"gateway: worker {worker.pid} could not start; stopping")
                    self.failed = True
                    self._stop(signal.SIGTERM)
                else:
                    log.warning(
                        f"gateway: worker {worker.pid} ended (exit status {status}); "
                        "starting another"
                    )
                    self._start()

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._stop(sig)

    def _on_reload(self, sig: int, frame: FrameType | None) -> None:
        if self.stopping:
            return
        log.info(
            f"gateway: SIGHUP: each of the {len(self.workers)} workers reads the config"
            " (and the TLS certificate)"
        )
        for worker in list(self.workers):
            if worker.poll() is None:
                worker.send_signal(signal.SIGHUP)

    def _stop(self, sig: int) -> None:
        first = not self.stopping
        self.stopping = True
        if first:  # a port stops accepting as soon as the workers close theirs
            self.sock.close()
            if self.admin_sock is not None:
                self.admin_sock.close()
        forward = signal.SIGTERM if first else sig
        for worker in list(self.workers):
            if worker.poll() is None:
                worker.send_signal(forward)


def _hold_sighup() -> None:
    """The worker starts with SIGHUP blocked (the mask survives exec): a reload asked while it
    starts stays pending and is delivered once its server handles it — never lost, never a stop."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})


__all__ = ["POLL_S", "STARTUP_FAILURE", "Supervisor"]
