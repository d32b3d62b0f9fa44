"""``python -m env_service [--env NAME] --host 127.0.0.1 --port 8082 [--workers N]``: serve an environment's tasks.

``--env`` picks the environment by its registered name (:mod:`env_service.registry`): ``bfcl``
(default; the BFCL multi-turn tasks), ``notes`` (the project's small example benchmark), or one a
``--plugin`` module registers (``--plugin my_env --env my_env``): plug-ins are imported before the
name is looked up.
No environment variables and no network are needed: BFCL's tasks come from the installed bfcl-eval
data and its splits from this project's ``data/`` folder; other environments ship their tasks.

The listening socket is bound before anything else starts, so a port that is taken or invalid ends
the command at once with one line on stderr and exit code 1, and no worker process is ever started.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from env_service.registry import DEFAULT_ENVIRONMENT, known_environments
from env_service.service import ServiceConfig

PROG = "python -m env_service"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    # No ``choices``: a --plugin module may register the name, and plug-ins load after parsing.
    p.add_argument("--env", default=DEFAULT_ENVIRONMENT, metavar="NAME",
                   help=f"the environment to serve, by name: {', '.join(known_environments())} or one a --plugin "
                        f"module registers (default {DEFAULT_ENVIRONMENT}; the trainer's env_service.env must "
                        "name the same)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8082, help="port to bind (default 8082; 0 picks a free one)")
    p.add_argument("--workers", type=int, default=None,
                   help="episode worker processes (default: one per CPU; 0 = inline in the server process)")
    p.add_argument("--ttl", type=float, default=3600.0, help="reap instances idle this many seconds (default 3600)")
    p.add_argument("--max-instances", type=int, default=1024, help="live instance cap; /create beyond it gets 503")
    p.add_argument("--request-timeout", type=float, default=60.0,
                   help="a worker slower than this on one request is restarted (default 60 s)")
    # A test hook: a "module:function" host that overrides the environment's own.
    p.add_argument("--host-factory", default=None, help=argparse.SUPPRESS)
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE in the service and its workers first, e.g. one registering an environment "
                        "or research failure tags (repeatable; the trainer's seal.plugins)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound socket for ``host:port``; raises ``SystemExit`` with one line when that is impossible."""
    if not 0 <= port <= 65535:
        raise SystemExit(f"{PROG}: --port {port} is not a TCP port (fix: pick one in 1-65535, e.g. --port 8082)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as err:
        reason = (err.strerror or str(err)).split(" (while attempting")[0]
        if isinstance(err, socket.gaierror) or (err.errno or 0) < 0:  # the name did not resolve
            raise SystemExit(f"{PROG}: cannot listen on {host}:{port}: {reason} "
                             "(fix: pass an address of this machine, e.g. --host 127.0.0.1)") from None
        raise SystemExit(f"{PROG}: cannot listen on {host}:{port}: {reason} "
                         "(fix: stop the process using it, or pass another --port / --host)") from None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        config = ServiceConfig(workers=args.workers, ttl_s=args.ttl, max_instances=args.max_instances,
                               request_timeout_s=args.request_timeout, host_factory=args.host_factory,
                               env=args.env, plugins=tuple(args.plugin))
    except ValueError as err:
        raise SystemExit(f"{PROG}: {err}") from None
    sock = bind_socket(args.host, args.port)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from env_service.app import create_app

    logging.getLogger(__name__).info("Serving environment %r on %s:%d (%d workers)", config.env, args.host,
                                     sock.getsockname()[1], config.resolved_workers)
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level=args.log_level, access_log=False,
                                           timeout_keep_alive=30))
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(1)  # uvicorn logged why (e.g. the workers could not start)


if __name__ == "__main__":
    main()
