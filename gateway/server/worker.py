"""One ``--workers`` process: ``python -m gateway.server.worker --listen-fd N --parent-fd M``.

Started by :class:`gateway.server.supervisor.Supervisor` with the socket ``gateway serve`` bound
(``--listen-fd``) and the read end of the supervisor's pipe (``--parent-fd``: it closes when
the supervisor is gone). The config is loaded the way ``gateway serve`` loaded it, from the
environment it set (``GATEWAY_CONFIG`` and the ``GATEWAY__…`` overrides); the process then
serves as a single ``gateway serve`` does (:class:`gateway.server.process.Server`) and exits 0
after a drain, :data:`~gateway.server.supervisor.STARTUP_FAILURE` when its app could not start.
"""

from __future__ import annotations

import argparse
import logging
import socket
from collections.abc import Sequence

from gateway.server.process import Server, configure_logging, defer_sighup, end_by_sigint
from gateway.server.state import server_state
from gateway.server.supervisor import STARTUP_FAILURE

log = logging.getLogger("gateway")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway.server.worker")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--parent-fd", type=int, required=True)
    args = parser.parse_args(argv)
    defer_sighup()  # the supervisor passes SIGHUP on only with [server.tls]: never fatal here
    try:
        from gateway.app import Gateway
        from gateway.config import load_config

        config = load_config()
        configure_logging(config)
        state = server_state(config, Gateway(config), freeze_gc=True)
    except Exception:
        log.exception("gateway: a worker could not start")
        return STARTUP_FAILURE
    sock = socket.socket(fileno=args.listen_fd)
    server = Server(state, sock, config.server.shutdown_grace_s, parent_fd=args.parent_fd)
    status = server.run()
    if server.interrupted:
        end_by_sigint()
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
