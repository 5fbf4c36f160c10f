"""Finding Python 3.12 for the tests that need it (tests/support/python312.py): on CI a missing one
fails those tests, so a green run has proven them; elsewhere it skips them."""

from __future__ import annotations

import pytest

from tests.support import python312


def test_without_python_3_12_a_ci_run_fails_rather_than_skips(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(python312, "find_python312", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"no Python 3\.12"):
        python312.python312()


def test_without_python_3_12_a_local_run_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(python312, "find_python312", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"no Python 3\.12"):
        python312.python312()


def test_the_python_found_is_3_12(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    found = python312.python312()
    assert found.name.startswith("python3")
    assert python312.find_python312() == found
