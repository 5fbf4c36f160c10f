"""mypy --strict accepts correctly typed handlers and enqueues (tests/typing/handlers_ok.py)
and rejects, line by line, the wrong ones, options included (tests/typing/handlers_bad.py:
``# E: <code>``)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.checkout import ROOT

TYPING = ROOT / "tests" / "typing"
EXPECTED = re.compile(r"# E: ([a-z-]+)")
REPORTED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def mypy(path: str, cache: str) -> list[tuple[int, str]]:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", cache, "--no-error-summary",
         "--show-error-codes", "--no-pretty", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stdout + result.stderr
    errors = []
    for line in result.stdout.splitlines():
        if match := REPORTED.match(line):
            errors.append((int(match["line"]), match["code"]))
        elif ": error:" in line:
            pytest.fail(f"unexpected mypy output: {line}")
    return errors


@pytest.fixture(scope="module")
def cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """pytest's cache directory, so that mypy reads tasklease's types once, not every run."""
    store = getattr(request.config, "cache", None)
    if store is None:  # -p no:cacheprovider
        return str(tmp_path_factory.mktemp("mypy-cache"))
    return str(store.mkdir("mypy-handler-typing"))


def test_well_typed_handlers_and_enqueues_pass_mypy_strict(cache: str) -> None:
    assert mypy("tests/typing/handlers_ok.py", cache) == []


def test_mypy_strict_rejects_each_wrong_handler_and_payload(cache: str) -> None:
    source = (TYPING / "handlers_bad.py").read_text().splitlines()
    expected = [
        (number, match[1])
        for number, line in enumerate(source, start=1)
        if (match := EXPECTED.search(line))
    ]
    assert len(expected) == 11
    assert mypy("tests/typing/handlers_bad.py", cache) == expected
