"""``python -m tasklease.worker.asgi_serve``: uvicorn serving the worker (the Procfile of
``server = "uvicorn"``), with Nagle's algorithm off on every connection.

With ``--workers`` over 1, uvicorn binds the listening socket itself with ``proto`` 0, and
asyncio then leaves ``TCP_NODELAY`` off on the connections it accepts: every keep-alive
request after the first waits ~40 ms for the peer's delayed ACK (Kludex/uvicorn#3149, open;
bench/asgi_throughput.py measured 350 req/s against 5500 with one worker). Linux hands a
listener's ``TCP_NODELAY`` down to the sockets it accepts, so it is set on the listener here,
before uvicorn's supervisor passes it to the workers. Otherwise this is ``uvicorn --factory``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import socket
from collections.abc import Sequence

from tasklease import protocol

DEFAULT_APP = "tasklease.worker.asgi:app_from_env"
# h11 (uvicorn's parser without httptools, as tasklease[asgi] installs it) holds 16 KiB of a
# request head still arriving, then answers 400 itself; Cloud Tasks delivers up to 80 KB of a
# task's headers (docs/platform-facts.md), plus the request line and the front end's own.
MAX_REQUEST_HEAD_BYTES = protocol.MAX_TASK_HEADER_BYTES + 16 * 1024


def main(argv: Sequence[str] | None = None) -> None:
    try:
        import uvicorn  # noqa: PLC0415 - the asgi extra's.
        from uvicorn.supervisors import Multiprocess  # noqa: PLC0415
    except ImportError:
        raise SystemExit("uvicorn is not installed: pip install 'tasklease[asgi]'") from None
    parser = argparse.ArgumentParser(prog="python -m tasklease.worker.asgi_serve")
    parser.add_argument("factory", nargs="?", default=DEFAULT_APP, help="module:callable")
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 - Cloud Run's container.
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    workers = int(os.environ.get("WEB_CONCURRENCY", "1"))
    parser.add_argument("--workers", type=int, default=workers)
    parser.add_argument("--timeout-graceful-shutdown", type=float, default=8.0)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-access-log", action="store_true")
    args = parser.parse_args(argv)
    config = uvicorn.Config(
        args.factory,
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        timeout_graceful_shutdown=int(args.timeout_graceful_shutdown),
        log_level=args.log_level,
        access_log=not args.no_access_log,
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
    )
    server = uvicorn.Server(config)
    if config.workers <= 1:
        server.run()  # asyncio builds the listener from getaddrinfo: TCP_NODELAY is on.
        return
    listener = config.bind_socket()
    if listener.family in (socket.AF_INET, socket.AF_INET6):
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if "target" in inspect.signature(Multiprocess).parameters:  # uvicorn before 0.50
        Multiprocess(config, target=server.run, sockets=[listener]).run()  # type: ignore[call-arg,unused-ignore]
    else:
        Multiprocess(config, sockets=[listener]).run()


if __name__ == "__main__":
    main()
