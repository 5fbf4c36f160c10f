"""Finding: the blocking sender (emulator/sender.py:111-121) catches only OSError and
HTTPException; a chunked answer with a negative chunk size makes http.client raise ValueError
("read length must be non-negative"), which escapes Sender.send. The dispatcher's _dispatch then
reschedules the task a second later with no delivery record and no attempt detail (and the
scheduler's sends blow up), instead of a failed attempt under the queue's retry policy, as the
selector path records it (IncompleteRead)."""

from __future__ import annotations

import socket
import time

from tasklease.emulator.faults import Faults
from tasklease.emulator.sender import Sender
from tests.emulator.test_emulator_sender import raw_target, read_request

ANSWER = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\nok\r\n0\r\n\r\n"


def _serve(connection: socket.socket, _: list[int]) -> None:
    with connection:
        if read_request(connection):
            connection.sendall(ANSWER)
            time.sleep(1)


def test_a_negative_chunk_size_is_a_failed_attempt_not_an_exception() -> None:
    sender = Sender(Faults())
    try:
        with raw_target(_serve) as (url, _):
            result = sender.send("POST", url, {}, b"{}", 3)[0]
    finally:
        sender.close()
    assert result.status is None and result.error
