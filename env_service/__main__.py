"""``python -m env_service --host 127.0.0.1 --port 8082 [--workers N]``: serve the BFCL multi-turn tasks.

No environment variables and no network are needed: the tasks come from the installed bfcl-eval data
and the splits from this project's ``data/`` folder.
"""

from __future__ import annotations

import argparse
import logging

from env_service.service import DEFAULT_HOST_FACTORY, ServiceConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m env_service", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8082, help="port to bind (default 8082)")
    p.add_argument("--workers", type=int, default=None,
                   help="episode worker processes (default: one per CPU; 0 = inline in the server process)")
    p.add_argument("--ttl", type=float, default=3600.0, help="reap instances idle this many seconds (default 3600)")
    p.add_argument("--max-instances", type=int, default=1024, help="live instance cap; /create beyond it gets 503")
    p.add_argument("--request-timeout", type=float, default=60.0,
                   help="a worker slower than this on one request is restarted (default 60 s)")
    p.add_argument("--host-factory", default=DEFAULT_HOST_FACTORY, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from env_service.app import create_app

    config = ServiceConfig(workers=args.workers, ttl_s=args.ttl, max_instances=args.max_instances,
                           request_timeout_s=args.request_timeout, host_factory=args.host_factory)
    logging.getLogger(__name__).info("Starting server on %s:%d (%d workers)", args.host, args.port,
                                     config.resolved_workers)
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level=args.log_level,
                access_log=False, timeout_keep_alive=30)


if __name__ == "__main__":
    main()
