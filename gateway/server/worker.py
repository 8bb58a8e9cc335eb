"""One ``--workers`` process: ``python -m gateway.server.worker --listen-fd N --parent-fd M
[--admin-fd A]``.

Started by :class:`gateway.server.supervisor.Supervisor` with the socket ``gateway serve`` bound
(``--listen-fd``; ``[admin] listen``'s: ``--admin-fd``, docs/spec.md §28) and the read end of
the supervisor's pipe (``--parent-fd``: it closes when the supervisor is gone). The config is
loaded the way ``gateway serve`` loaded it, from the environment it set (``GATEWAY_CONFIG`` and
the ``GATEWAY__…`` overrides); the process then serves as a single ``gateway serve`` does
(:class:`gateway.server.process.Server`) and exits 0 after a drain,
:data:`~gateway.server.supervisor.STARTUP_FAILURE` when its app could not start.
"""

from __future__ import annotations

import argparse
import logging
import socket
from collections.abc import Sequence

from gateway.server.process import (
    Server,
    admin_listeners,
    configure_logging,
    end_by_sigint,
    on_reload,
)
from gateway.server.state import server_state
from gateway.server.supervisor import STARTUP_FAILURE

log = logging.getLogger("gateway")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway.server.worker")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--parent-fd", type=int, required=True)
    parser.add_argument("--admin-fd", type=int)
    args = parser.parse_args(argv)
    try:
        from gateway.app import Gateway
        from gateway.config import load_config

        config = load_config()
        configure_logging(config)
        app = Gateway(config)
        state = server_state(config, app, freeze_gc=True)
        on_reload(state, app)  # SIGHUP, forwarded by the supervisor (docs/spec.md §29)
    except Exception:
        log.exception("gateway: a worker could not start")
        return STARTUP_FAILURE
    sock = socket.socket(fileno=args.listen_fd)
    admin = None if args.admin_fd is None else socket.socket(fileno=args.admin_fd)
    server = Server(
        state,
        sock,
        config.server.shutdown_grace_s,
        parent_fd=args.parent_fd,
        listeners=admin_listeners(state, app, admin),
    )
    status = server.run()
    if server.interrupted:
        end_by_sigint()
    return status


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
