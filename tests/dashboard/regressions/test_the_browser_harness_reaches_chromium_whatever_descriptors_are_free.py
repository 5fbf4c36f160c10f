"""Finding: the browser harness maps its two pipes onto Chromium's descriptors 3 and 4 one
redirection at a time. Late in a long test session descriptors 3 or 4 can be free again, and
a pipe that got one of them was overwritten or closed by the other's redirection: Chromium
never answered (``Chromium did not answer Target.createTarget in 15 s``), in whichever
browser test came next. A fresh interpreter, whose first pipe is 3 and 4, shows it every
time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.browser import find_chromium

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import os, sys, tempfile
from pathlib import Path
from tests.support.browser import Browser
assert not any(os.path.exists(f"/proc/self/fd/{fd}") for fd in (3, 4)), "3 or 4 in use"
with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
    browser = Browser(sys.argv[1], Path(profile))
    try:
        print(browser.send("Target.createTarget", {"url": "about:blank"}, timeout=30)["targetId"])
    finally:
        browser.process.kill()
        browser.process.wait()
"""


def test_a_browser_started_while_descriptors_3_and_4_are_free_answers() -> None:
    binary = find_chromium()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, binary],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), "no target id"
