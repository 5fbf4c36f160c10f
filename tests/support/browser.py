"""Headless Chromium for tests, driven over the DevTools protocol on a pipe: no dependency.

``--remote-debugging-pipe`` makes Chromium read protocol messages (JSON, each ended by a NUL
byte) from its file descriptor 3 and write answers and events to descriptor 4, so no
websocket client is needed. Chromium comes from Debian's ``chromium`` package: installed
when absent if we are root (as in CI), else the tests skip loudly; in CI (``CI=true``) a
Chromium that cannot be had fails them.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI") == "true"
# The Debian package's own binary: /usr/bin/chromium is a wrapper script that only adds flags.
DEBIAN_BINARY = Path("/usr/lib/chromium/chromium")
FLAGS = [
    "--headless",
    "--remote-debugging-pipe",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-gpu",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--window-size=1280,860",
]


def find_chromium() -> str:
    """The Chromium binary: found, installed (as root), or the test skipped/failed."""
    found = _which()
    if found:
        return found
    reason = "chromium is not installed"
    if os.geteuid() == 0 and shutil.which("apt-get"):
        install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (install, ["apt-get", "update"], install):
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if command is install and done.returncode == 0:
                break
        found = _which()
        if found:
            return found
        reason = f"apt-get install chromium failed: {done.stderr.strip()[-300:]}"
    if IN_CI:
        pytest.fail(f"the dashboard's browser test needs Chromium in CI: {reason}", pytrace=False)
    pytest.skip(f"NO BROWSER TEST: {reason} (as root: apt-get install chromium)")


def _above_4(*fds: int) -> tuple[int, ...]:
    """``fds`` moved to descriptors above 4. The script below maps ours onto the browser's 3
    and 4 one redirection at a time, so one of ours that already is 3 or 4 (free again late
    in a long test session) would be overwritten or closed by the other's redirection, and
    Chromium would never answer."""
    moved = []
    for fd in fds:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
        os.close(fd)
        moved.append(high)
    return tuple(moved)


def _which() -> str | None:
    if DEBIAN_BINARY.exists():
        return str(DEBIAN_BINARY)
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium; :meth:`tab` opens a page to drive."""

    def __init__(self, binary: str, profile: Path, extra_flags: Sequence[str] = ()) -> None:
        to_chrome_read, to_chrome_write = _above_4(*os.pipe())
        from_chrome_read, from_chrome_write = _above_4(*os.pipe())
        flags = [*FLAGS, *extra_flags, f"--user-data-dir={profile}"]
        if os.geteuid() == 0:
            flags.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox.
        # Descriptors 3 and 4 of the browser are our pipes: the shell maps them, then execs.
        script = (
            f'exec "$0" "$@" 3<&{to_chrome_read} 4>&{from_chrome_write} '
            f"{to_chrome_read}<&- {from_chrome_write}>&-"
        )
        self.process = subprocess.Popen(
            ["bash", "-c", script, binary, *flags, "about:blank"],
            pass_fds=(to_chrome_read, from_chrome_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_chrome_read)
        os.close(from_chrome_write)
        self._out = os.fdopen(to_chrome_write, "wb", buffering=0)
        self._in = os.fdopen(from_chrome_read, "rb", buffering=0)
        self._next_id = 0
        self._answers: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buffer = b""
        while chunk := self._in.read(65536):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            with self._changed:
                for raw in messages:
                    message = json.loads(raw)
                    if "id" in message:
                        self._answers[message["id"]] = message
                    else:
                        self.events.append(message)
                self._changed.notify_all()

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 15,
    ) -> dict[str, Any]:
        with self._changed:
            self._next_id += 1
            ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        with self._changed:
            if not self._changed.wait_for(lambda: ident in self._answers, timeout):
                raise TimeoutError(f"Chromium did not answer {method} in {timeout} s")
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def wait_for_event(self, method: str, session: str, since: int, timeout: float = 15) -> None:
        def seen() -> bool:
            return any(
                e.get("method") == method and e.get("sessionId") == session
                for e in self.events[since:]
            )

        with self._changed:
            if not self._changed.wait_for(seen, timeout):
                raise TimeoutError(f"no {method} within {timeout} s")

    def tab(self) -> Tab:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        tab = Tab(self, session["sessionId"])
        tab.send("Page.enable")
        tab.send("Runtime.enable")
        return tab

    def close(self) -> None:
        with suppress(TimeoutError, RuntimeError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=10)
        self._out.close()
        self._reader.join(timeout=5)  # It ends at the end of the pipe, once Chromium is gone.
        self._in.close()


class Tab:
    """One page: navigate, evaluate, click through, screenshot."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, self.session)

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Wait, after the block, for the page load the block caused."""
        since = len(self.browser.events)
        yield
        self.browser.wait_for_event("Page.loadEventFired", self.session, since)

    def goto(self, url: str) -> None:
        with self.loading():
            self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        answer = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def click(self, selector: str) -> None:
        """Click the element and wait for the page it leads to."""
        with self.loading():
            found = self.evaluate(
                f"(e => e ? (e.click(), true) : false)(document.querySelector({selector!r}))"
            )
            assert found, f"nothing matches {selector}"

    def text(self, selector: str = "body") -> str:
        value = self.evaluate(f"document.querySelector({selector!r})?.innerText ?? ''")
        return str(value)

    @property
    def url(self) -> str:
        return str(self.evaluate("location.href"))

    def resize(self, width: int, height: int, mobile: bool = False) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])
        path.write_bytes(data)
        return data


@contextmanager
def chromium(extra_flags: Sequence[str] = ()) -> Iterator[Browser]:
    """A headless Chromium for the block; ``extra_flags`` such as
    ``--host-resolver-rules=MAP rebound.test 127.0.0.1`` (a DNS answer the test chooses)."""
    binary = find_chromium()
    with tempfile.TemporaryDirectory(prefix="tasklease-chromium-") as profile:
        browser = Browser(binary, Path(profile), extra_flags)
        try:
            yield browser
        finally:
            browser.close()


def png_colours(data: bytes) -> tuple[int, int, Counter[bytes]]:
    """Width, height and a sample of pixel colours of an 8-bit RGB(A) PNG, decoded with zlib
    alone (no image library): enough to tell a rendered page from a blank one."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks, header = 8, [], b""
    while position < len(data):
        length = int.from_bytes(data[position : position + 4], "big")
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:8], "big")
    depth, colour_type, interlace = header[8], header[9], header[12]
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, "unexpected PNG format"
    channels = 4 if colour_type == 6 else 3
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    previous = bytearray(stride)
    colours: Counter[bytes] = Counter()
    started = time.monotonic()
    for row in range(height):
        offset = row * (stride + 1)
        filter_type, line = raw[offset], bytearray(raw[offset + 1 : offset + 1 + stride])
        _unfilter(filter_type, line, previous, channels)
        if row % 4 == 0:
            colours.update(bytes(line[i : i + 3]) for i in range(0, stride, channels * 4))
        previous = line
    assert time.monotonic() - started < 30
    return width, height, colours


def _unfilter(kind: int, line: bytearray, previous: bytearray, step: int) -> None:
    if kind == 0:
        return
    if kind == 2:
        for i in range(len(line)):
            line[i] = (line[i] + previous[i]) & 0xFF
        return
    for i in range(len(line)):
        left = line[i - step] if i >= step else 0
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            up, corner = previous[i], previous[i - step] if i >= step else 0
            estimate = left + up - corner
            distances = (abs(estimate - left), abs(estimate - up), abs(estimate - corner))
            nearest = (
                left
                if distances[0] <= min(distances[1:])
                else (up if distances[1] <= distances[2] else corner)
            )
            line[i] = (line[i] + nearest) & 0xFF
