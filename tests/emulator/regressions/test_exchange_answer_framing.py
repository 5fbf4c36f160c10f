"""Finding: the dispatcher's non-blocking reader (emulator/http_wire.py ResponseReader) does
not read answers as http.client (the blocking sender) does. A response head ended by bare LF
line breaks (http.client accepts them), or a 2xx with its Content-Length header repeated
(http.client takes the first value), never reads as complete on a kept-alive connection: the
attempt that the target answered 200 is recorded as "no answer within the deadline" and the
task is sent again, so work the target did and acknowledged is duplicated."""

from __future__ import annotations

import socket
import time

import pytest

from tasklease.emulator.faults import Faults
from tasklease.emulator.sender import Sender
from tests.emulator.test_emulator_exchanges import exchange
from tests.emulator.test_emulator_sender import raw_target, read_request

ANSWERS = {
    "bare-lf": b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    "content-length-twice": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"
    ),
}


def _answering(answer: bytes):  # type: ignore[no-untyped-def]
    def serve(connection: socket.socket, _: list[int]) -> None:
        with connection:
            while read_request(connection):
                connection.sendall(answer)  # And keeps the connection open.
            time.sleep(5)

    return serve


@pytest.mark.parametrize("answer", list(ANSWERS.values()), ids=list(ANSWERS))
def test_a_2xx_http_client_accepts_is_a_success_on_the_selector_path(answer: bytes) -> None:
    with raw_target(_answering(answer)) as (url, _):
        sender = Sender(Faults())
        blocking = sender.send("POST", url, {}, b"{}", 3)[0]
        sender.close()
        selector = exchange(url, timeout=3)
    assert (blocking.status, blocking.error) == (200, None)
    assert (selector.status, selector.error) == (200, None)
