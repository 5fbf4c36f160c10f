"""The dispatcher's non-blocking HTTP exchanges: the same requests and the same readings of
answers as the blocking sender, connections kept alive and never flooding a target."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Hashable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from urllib3.util import parse_url

from tasklease.emulator.exchanges import Exchanges, direct_origin
from tasklease.emulator.faults import Faults
from tasklease.emulator.http_wire import ResponseReader
from tasklease.emulator.sender import AttemptResult, Sender
from tests.emulator.test_emulator_sender import (
    OK,
    answer_forever,
    answer_once_then_close,
    never_answer,
    raw_target,
)


def exchange(
    url: str,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    body: bytes = b"{}",
    timeout: float = 5,
    exchanges: Exchanges | None = None,
) -> AttemptResult:
    own = exchanges is None
    engine = exchanges or Exchanges()
    try:
        return run(engine, [(url, method, headers or {}, body, timeout)])[0]
    finally:
        if own:
            engine.close()


def run(
    engine: Exchanges, requests: list[tuple[str, str, dict[str, str], bytes, float]]
) -> list[AttemptResult]:
    results: dict[Hashable, AttemptResult] = {}
    for key, (url, method, headers, body, timeout) in enumerate(requests):
        parsed = parse_url(url)
        origin = direct_origin(parsed)
        assert origin is not None
        engine.start(
            key,
            origin,
            method=method,
            target=parsed.request_uri,
            headers=dict(headers),
            body=body,
            timeout=timeout,
        )
    deadline = time.monotonic() + 30
    while len(results) < len(requests) and time.monotonic() < deadline:
        results.update(engine.poll(0.5))
    return [results[key] for key in range(len(requests))]


def captured_request(
    send: object, method: str, headers: dict[str, str], body: bytes, path: str = "/p?q=1"
) -> bytes:
    """The bytes a raw target receives for one request sent by ``send``."""
    seen: list[bytes] = []

    def serve(connection: socket.socket, _: list[int]) -> None:
        with connection:
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            head, _separator, rest = data.partition(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")),
                0,
            )  # fmt: skip
            while len(rest) < length:
                rest += connection.recv(65536)
            seen.append(head + b"\r\n\r\n" + rest)
            connection.sendall(OK)

    with raw_target(serve) as (url, _):
        target = url.replace("/t", path)
        if send == "blocking":
            blocking_send(target, method=method, headers=headers, body=body)
        else:
            exchange(target, method=method, headers=headers, body=body)
    port = parse_url(url).port
    return seen[0].replace(f":{port}\r\n".encode(), b":PORT\r\n")


def blocking_send(
    url: str, *, method: str = "POST", headers: dict[str, str] | None = None, body: bytes = b"{}"
) -> AttemptResult:
    sender = Sender(Faults())
    try:
        return sender.send(method, url, dict(headers or {}), body, 5)[0]
    finally:
        sender.close()


@pytest.mark.parametrize(
    ("method", "headers", "body"),
    [
        ("POST", {"User-Agent": "Google-Cloud-Tasks", "X-A": "1", "Content-Type": "a/b"}, b"{}"),
        ("GET", {"User-Agent": "U"}, b""),
        ("PUT", {"User-Agent": "U", "Host": "example.com"}, b"x"),
        ("POST", {"User-Agent": "U", "X-Latin": "caf\u00e9"}, b""),
        ("DELETE", {"Content-Length": "1", "Accept-Encoding": "gzip"}, b"z"),
    ],
)
def test_the_bytes_on_the_wire_are_the_blocking_senders(
    method: str, headers: dict[str, str], body: bytes
) -> None:
    assert captured_request("loop", method, headers, body) == captured_request(
        "blocking", method, headers, body
    )


def test_a_header_http_client_refuses_is_refused_before_sending() -> None:
    engine = Exchanges()
    try:
        with pytest.raises(ValueError, match="Invalid header value"):
            engine.start(
                "k",
                ("127.0.0.1", 9),
                method="POST",
                target="/",
                headers={"X-Evil": "a\r\nInjected: 1"},
                body=b"",
                timeout=5,
            )
    finally:
        engine.close()


def test_only_plain_http_to_an_address_without_dns_goes_this_way() -> None:
    assert direct_origin(parse_url("http://127.0.0.1:8080/x")) == ("127.0.0.1", 8080)
    assert direct_origin(parse_url("http://localhost/x")) == ("localhost", 80)
    assert direct_origin(parse_url("http://[::1]:9/x")) == ("::1", 9)
    assert direct_origin(parse_url("https://127.0.0.1/x")) is None
    assert direct_origin(parse_url("http://worker.internal/x")) is None


def test_exchanges_share_one_kept_alive_connection() -> None:
    engine = Exchanges()
    with raw_target(answer_forever) as (url, accepted):
        results = [exchange(url, exchanges=engine) for _ in range(5)]
    engine.close()
    assert [result.status for result in results] == [200] * 5
    assert len(accepted) == 1


def test_a_connection_the_target_closed_is_not_reused() -> None:
    engine = Exchanges()
    with raw_target(answer_once_then_close) as (url, accepted):
        first = exchange(url, exchanges=engine)
        time.sleep(0.2)
        engine.poll(0)  # The idle connection's close is noticed here.
        second = exchange(url, exchanges=engine)
    engine.close()
    assert (first.status, second.status, second.error) == (200, 200, None)
    assert len(accepted) == 2


def test_no_answer_within_the_deadline() -> None:
    with raw_target(never_answer) as (url, _):
        started = time.monotonic()
        result = exchange(url, timeout=0.5)
    assert (result.status, result.error) == (None, "no answer within the deadline")
    assert 0.4 < time.monotonic() - started < 2


def test_a_refused_connection_reads_as_with_the_blocking_sender() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    blocking = blocking_send(url, body=b"")
    loop = exchange(url, body=b"")
    assert (loop.status, loop.error) == (None, blocking.error)


def read_whole_request(connection: socket.socket) -> bool:
    """Head and body: a target that closes with bytes unread resets the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next((int(line[15:]) for line in lines if line.startswith(b"content-length:")), 0)
    while len(body) < length:
        body += connection.recv(65536)
    return True


def answering(response: bytes, *, then_close: bool = False) -> object:
    def serve(connection: socket.socket, _: list[int]) -> None:
        with connection:
            if read_whole_request(connection):
                for byte in range(0, len(response), 7):  # In pieces, to read incrementally.
                    connection.sendall(response[byte : byte + 7])
                    time.sleep(0.001)
                if not then_close:
                    time.sleep(0.3)

    return serve


@pytest.mark.parametrize(
    ("response", "then_close", "method", "expected"),
    [
        (b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nX-Tasklease-Outcome: busy\r\n"
         b"Content-Length: 2\r\n\r\nno", False, "POST", (503, "busy", 7.0)),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
         b"4;x=y\r\ndefg\r\n0\r\nTrailer: 1\r\n\r\n", False, "POST", (200, None, None)),
        (b"HTTP/1.0 201 Created\r\n\r\nuntil the close", True, "POST", (201, None, None)),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", False, "HEAD", (200, None, None)),
        (b"HTTP/1.1 204 No Content\r\n\r\n", False, "POST", (204, None, None)),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n",
         False, "POST", (202, None, None)),
        (b"HTTP/1.1 429 Slow\r\nX-Tasklease-Outcome: a\r\nX-Tasklease-Outcome: b\r\n"
         b"Content-Length: 0\r\n\r\n", False, "POST", (429, "a, b", None)),
    ],
)  # fmt: skip
def test_answers_are_read_as_http_client_reads_them(
    response: bytes, then_close: bool, method: str, expected: tuple[object, ...]
) -> None:
    results = []
    for send in ("loop", "blocking"):
        with raw_target(answering(response, then_close=then_close)) as (url, _):  # type: ignore[arg-type]
            if send == "loop":
                result = exchange(url, method=method)
            else:
                result = blocking_send(url, method=method)
        results.append((result.status, result.outcome, result.retry_after, result.error))
    assert results[0] == results[1] == (*expected, None)


@pytest.mark.parametrize(
    "response",
    [b"garbage\r\n\r\n", b"HTTP/1.1 2OO OK\r\n\r\n",
     b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab"],
)  # fmt: skip
def test_a_broken_answer_is_a_failed_attempt(response: bytes) -> None:
    with raw_target(answering(response, then_close=True)) as (url, _):  # type: ignore[arg-type]
        loop = exchange(url, body=b"")
    with raw_target(answering(response, then_close=True)) as (url, _):  # type: ignore[arg-type]
        blocking = blocking_send(url, body=b"")
    assert loop.status is None and blocking.status is None
    assert loop.error is not None and blocking.error is not None
    assert loop.error.split(":")[0] == blocking.error.split(":")[0]


def test_a_burst_reaches_a_target_with_a_small_backlog() -> None:
    """Python's socketserver listens with a backlog of 5: hundreds of connections opened at
    once would be dropped by the kernel, and their attempts would wait for their deadline."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    assert server.request_queue_size == 5
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = Exchanges()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x"
        started = time.monotonic()
        results = run(engine, [(url, "POST", {}, b"{}", 20.0)] * 300)
    finally:
        engine.close()
        server.shutdown()
        server.server_close()
    assert [result.status for result in results] == [200] * 300
    assert time.monotonic() - started < 10


def test_a_response_read_one_byte_at_a_time() -> None:
    reader = ResponseReader(head=False)
    for byte in b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n":
        assert not reader.done
        reader.feed(bytes([byte]))
    assert (reader.done, reader.status, reader.will_close) == (True, 200, False)


def test_localhost_falls_back_to_its_next_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """As socket.create_connection: ``localhost`` may resolve to ::1 first while the target
    listens on 127.0.0.1 only."""
    with raw_target(answer_forever) as (url, _):
        port = int(parse_url(url).port or 0)
        with socket.socket() as probe:  # Nothing listens here.
            probe.bind(("127.0.0.1", 0))
            closed = probe.getsockname()
        stream = socket.SOCK_STREAM
        addresses = [
            (socket.AF_INET, stream, 6, "", closed),
            (socket.AF_INET, stream, 6, "", ("127.0.0.1", port)),
        ]
        monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: list(addresses))
        result = exchange(f"http://localhost:{port}/t")
    assert (result.status, result.error) == (200, None)
