"""Finding (a CI run's lost-response fault test): a target that closes a kept-alive connection
as the next request goes out on it (a keep-alive timeout firing then; the close arrives after
the pool's check) made the attempt fail with ``RemoteDisconnected``, though the target never
answered it. Both senders now send such a request again on a new connection, once, within the
attempt; a target that closes a new connection unanswered still fails the attempt."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest

from tasklease.emulator.exchanges import Exchanges
from tasklease.emulator.faults import Faults
from tasklease.emulator.sender import AttemptResult, Sender
from tests.emulator.test_emulator_exchanges import exchange
from tests.emulator.test_emulator_sender import (
    OK,
    answer_once_then_close,
    raw_target,
    read_request,
)

Send = Callable[[str], tuple[AttemptResult, AttemptResult]]


def answer_once_then_close_unanswered(connection: socket.socket, _: list[int]) -> None:
    """Answers a connection's first request; closes as its second one arrives."""
    with connection:
        if read_request(connection):
            connection.sendall(OK)
            read_request(connection)


def never_answer_a_second(connection: socket.socket, accepted: list[int]) -> None:
    """Answers the first connection's first request, then closes every request unanswered."""
    with connection:
        if read_request(connection) and len(accepted) == 1:
            connection.sendall(OK)
            read_request(connection)


def two_attempts_on_the_loop(url: str) -> tuple[AttemptResult, AttemptResult]:
    engine = Exchanges()
    try:
        first = exchange(url, exchanges=engine)
        time.sleep(0.2)  # The target's close arrives; the loop has not looked since.
        return first, exchange(url, exchanges=engine)
    finally:
        engine.close()


def two_blocking_attempts(url: str) -> tuple[AttemptResult, AttemptResult]:
    sender = Sender(Faults())
    try:
        return sender.send("POST", url, {}, b"{}", 5)[0], sender.send("POST", url, {}, b"{}", 5)[0]
    finally:
        sender.close()


def test_a_kept_alive_connection_closed_before_the_loop_noticed_is_replaced() -> None:
    with raw_target(answer_once_then_close) as (url, accepted):
        first, second = two_attempts_on_the_loop(url)
    assert (first.status, second.status, second.error) == (200, 200, None)
    assert len(accepted) == 2


@pytest.mark.parametrize("send", [two_attempts_on_the_loop, two_blocking_attempts])
def test_a_request_the_target_closed_unanswered_goes_again_on_a_new_connection(
    send: Send,
) -> None:
    with raw_target(answer_once_then_close_unanswered) as (url, accepted):
        first, second = send(url)
    assert (first.status, second.status, second.error) == (200, 200, None)
    assert len(accepted) == 2


@pytest.mark.parametrize("send", [two_attempts_on_the_loop, two_blocking_attempts])
def test_a_new_connection_closed_unanswered_fails_the_attempt(send: Send) -> None:
    with raw_target(never_answer_a_second) as (url, accepted):
        first, second = send(url)
    assert first.status == 200
    assert second.status is None and second.error is not None
    assert "closed connection without response" in second.error
    assert len(accepted) == 2  # One request again, not a loop.
