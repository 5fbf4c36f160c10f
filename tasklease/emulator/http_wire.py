"""HTTP/1.1 requests as bytes and responses read from bytes, for the non-blocking dispatch.

Requests are encoded by http.client itself (a connection that collects what it would send),
so their bytes and their validation (method, path, header names and values) are exactly those
of the blocking sender. Responses are read incrementally with http.client's rules for what
ends a message (HTTP/1.1 RFC 9112 section 6.3): no body after HEAD, 1xx, 204 or 304; a
chunked body; Content-Length; or, failing those, the connection's close. ``100 Continue`` is
skipped, as http.client skips it.
"""

from __future__ import annotations

import http.client
from typing import Any

from tasklease.emulator.headers import without_framing

_MAX_LINE = 65536  # http.client's _MAXLINE: a longer status or header line is refused.
_MAX_HEADERS = 100  # http.client's _MAXHEADERS.


class _Encoder(http.client.HTTPConnection):
    """An HTTPConnection that keeps what it would send instead of sending it."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.sent: list[bytes] = []

    def send(self, data: Any) -> None:
        self.sent.append(bytes(data))


def encode_request(
    host: str, port: int, *, method: str, target: str, headers: dict[str, str], body: bytes
) -> bytes:
    """The bytes http.client sends for this request; its ValueError or InvalidURL if it
    refuses it (a header value with a line break, say)."""
    encoder = _Encoder(host, port)
    encoder.request(method, target, body=body, headers=without_framing(headers))
    return b"".join(encoder.sent)


class ResponseReader:
    """Reads one response from the bytes :meth:`feed` is given; :attr:`done` once complete.

    Raises http.client's own errors for what http.client refuses (a bad status line, a line
    too long, a body cut short), so failed attempts read as they did with http.client.
    """

    def __init__(self, *, head: bool) -> None:
        self._head = head
        self._buffer = bytearray()
        self._state = "head"  # head, length, chunk-size, chunk-data, trailer, close, done
        self._remaining = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.will_close = False
        self.received_any = False

    @property
    def done(self) -> bool:
        return self._state == "done"

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def feed(self, data: bytes) -> None:
        """Take bytes read from the connection."""
        self.received_any = self.received_any or bool(data)
        self._buffer += data
        while self._state != "done" and self._step():
            pass

    def eof(self) -> None:
        """The target closed the connection: the end of a close-delimited body, else an
        error."""
        if self._state == "close":
            self._state = "done"
        elif self._state == "head" and not self.received_any:
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        elif self._state != "done":
            raise http.client.IncompleteRead(bytes(self._buffer))

    def _step(self) -> bool:
        """Advance as far as the buffer allows; False when more bytes are needed."""
        if self._state == "head":
            return self._read_head()
        if self._state == "length":
            taken = min(self._remaining, len(self._buffer))
            del self._buffer[:taken]
            self._remaining -= taken
            if self._remaining == 0:
                self._state = "done"
                return True
            return False
        if self._state == "chunk-size":
            line = self._line()
            if line is None:
                return False
            size = line.split(b";", 1)[0]
            try:
                self._remaining = int(size, 16)
            except ValueError:
                raise http.client.IncompleteRead(b"") from None
            self._state = "chunk-data" if self._remaining else "trailer"
            self._remaining += 2 if self._remaining else 0  # The chunk's CRLF.
            return True
        if self._state == "chunk-data":
            taken = min(self._remaining, len(self._buffer))
            del self._buffer[:taken]
            self._remaining -= taken
            if self._remaining == 0:
                self._state = "chunk-size"
                return True
            return False
        if self._state == "trailer":
            line = self._line()
            if line is None:
                return False
            if line in (b"", b"\r"):
                self._state = "done"
            return True
        if self._state == "close":  # Everything until the close is the body.
            self._buffer.clear()
        return False

    def _line(self) -> bytes | None:
        end = self._buffer.find(b"\n")
        if end < 0:
            if len(self._buffer) > _MAX_LINE:
                raise http.client.LineTooLong("chunk size or trailer line")
            return None
        line = bytes(self._buffer[:end]).rstrip(b"\r")
        del self._buffer[: end + 1]
        return line

    def _read_head(self) -> bool:
        """Read the status line and headers once they are all in, line by line as
        http.client does: lines end in CRLF or a bare LF, and an empty line ends the head."""
        lines: list[bytes] = []
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end < 0:
                self._check_head_size(lines, len(self._buffer) - start)
                return False
            line = bytes(self._buffer[start:end]).rstrip(b"\r")
            start = end + 1
            if not lines and not line:  # No status line: http.client refuses it at once.
                raise http.client.BadStatusLine("")
            if not line:
                break
            lines.append(line)
            self._check_head_size(lines, 0)
        del self._buffer[:start]
        status_line = str(lines[0], "iso-8859-1")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise http.client.BadStatusLine(status_line)
        try:
            status = int(parts[1])
        except ValueError:
            raise http.client.BadStatusLine(status_line) from None
        if not 100 <= status <= 999:
            raise http.client.BadStatusLine(status_line)
        if status == http.client.CONTINUE:  # An interim answer: the real one follows.
            return True
        values: dict[str, list[str]] = {}
        for raw in lines[1:]:
            name, _, value = str(raw, "iso-8859-1").partition(":")
            values.setdefault(name.strip().lower(), []).append(value.strip())
        # As HTTPResponse: getheader() joins repeated values; framing reads the first one.
        self.status = status
        self.headers = {name: ", ".join(found) for name, found in values.items()}
        self._frame(parts[0], {name: found[0] for name, found in values.items()})
        return True

    def _check_head_size(self, lines: list[bytes], partial: int) -> None:
        """http.client's limits: no line over _MAX_LINE, no more than _MAX_HEADERS headers."""
        if partial > _MAX_LINE or any(len(line) > _MAX_LINE for line in lines[-1:]):
            raise http.client.LineTooLong("header line")
        if len(lines) - 1 > _MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {_MAX_HEADERS} headers")

    def _frame(self, version: str, first: dict[str, str]) -> None:
        """How the body ends, as http.client's HTTPResponse.begin decides it (from each
        header's first value, ``first``)."""
        connection = (first.get("connection") or "").lower()
        if version == "HTTP/1.1":
            self.will_close = "close" in connection
        else:  # HTTP/1.0 (or older): closed unless kept alive.
            self.will_close = "keep-alive" not in connection and "keep-alive" not in first
        chunked = (first.get("transfer-encoding") or "").lower() == "chunked"
        length: int | None = None
        if not chunked and "content-length" in first:
            try:
                length = int(first["content-length"])
            except ValueError:
                length = None
            if length is not None and length < 0:
                length = None
        if self.status in (204, 304) or 100 <= self.status < 200 or self._head:
            chunked, length = False, 0
        if chunked:
            self._state = "chunk-size"
        elif length is not None:
            self._state, self._remaining = "length", length
        else:
            self.will_close = True
            self._state = "close"
        if self._state == "length" and length == 0:
            self._state = "done"
