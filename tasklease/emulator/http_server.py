"""The emulator's HTTP server: waitress, serving the REST app from a thread of the emulator.

werkzeug's development server, used before, closes the connection after every response
(werkzeug/serving.py: "Always close the connection") and starts a thread per request, so every
REST call paid a TCP connect on both sides. waitress keeps HTTP/1.1 connections alive and
serves requests from a fixed pool of threads; it is pure Python, and it runs inside this
process, so REST, gRPC, the dispatcher and the scheduler still share one model and one
database.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from waitress import wasyncore
from waitress.server import create_server

# Enough for the busiest test or benchmark; select() would fail past 1024 open sockets, so
# the loop uses poll().
CONNECTION_LIMIT = 1000
_STOP_SECONDS = 5.0


def _quiet_logger() -> logging.Logger:
    """A logger that drops everything: waitress warns "Task queue depth is N" whenever every
    request thread is busy, which a busy emulator is by design (waitress/task.py)."""
    logger = logging.Logger("tasklease.emulator.http.queue", logging.CRITICAL + 1)
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


class HttpServer:
    """A WSGI ``app`` on ``host``:``port`` (0: any free port), served by ``threads`` threads.

    Binds like werkzeug's server did: IPv6 when ``host`` has a colon, else IPv4, to the first
    address ``host`` resolves to. No access log: the delivery log is the emulator's record.
    """

    def __init__(self, app: Any, host: str, port: int, threads: int = 8) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        address = socket.getaddrinfo(
            host.strip("[]"), port, family, socket.SOCK_STREAM, socket.IPPROTO_TCP
        )[0][4]
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
        except OSError:
            listener.close()
            raise
        self.port: int = listener.getsockname()[1]
        self._map: dict[int, Any] = {}
        self._server = create_server(
            app,
            map=self._map,
            sockets=[listener],
            threads=threads,
            connection_limit=CONNECTION_LIMIT,
            asyncore_use_poll=True,
            clear_untrusted_proxy_headers=False,  # Headers reach the app as sent.
            ident="tasklease-emulator",
        )
        self._server.task_dispatcher.queue_logger = _quiet_logger()
        self._thread = threading.Thread(target=self._server.run, name="emulator-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Close the listener and every connection, then end the request threads."""
        if self._thread.is_alive():
            # Sockets are closed by the loop's own thread (a thunk run by its trigger): closing
            # them from here could pull a socket from under a poll() in progress.
            self._server.trigger.pull_trigger(lambda: wasyncore.close_all(self._map))
            self._thread.join(_STOP_SECONDS)
        else:
            wasyncore.close_all(self._map)
        self._server.task_dispatcher.shutdown(timeout=_STOP_SECONDS)
