"""A typo in the router reference: one line saying the module was found, the attribute was
not, and the name meant; no traceback, from `tasklease dev` and from gunicorn alike."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasklease.errors import ConfigurationError
from tasklease.worker.serving.router_reference import load_router
from tests.support.dev_stack import dev_flags, start_dev, wait_gone

HINT = (
    "myshop.tasks:routr: module myshop.tasks found, but it has no attribute 'routr': "
    "did you mean 'router'?"
)


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    """A user's project directory with a myshop package holding a router."""
    (tmp_path / "myshop").mkdir()
    (tmp_path / "myshop" / "__init__.py").write_text("")
    (tmp_path / "myshop" / "tasks.py").write_text(
        "from tasklease import Router\n\nrouter = Router()\n"
    )
    return tmp_path


def test_load_router_suggests_the_attribute_meant(
    shop: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(shop))
    with pytest.raises(ConfigurationError) as raised:
        load_router("myshop.tasks:routr")
    assert str(raised.value) == HINT


def test_load_router_names_a_missing_module_and_the_install_step() -> None:
    with pytest.raises(ConfigurationError, match=r"no module named 'nosuchshop'.*pip install -e"):
        load_router("nosuchshop.tasks:router")


def test_tasklease_dev_prints_one_line_for_a_router_typo(shop: Path) -> None:
    process, marker = start_dev(shop, ["myshop.tasks:routr", *dev_flags()])
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    assert output.splitlines() == [f"tasklease dev: {HINT}"]
    assert wait_gone(marker) == []


def test_tasklease_dev_reads_the_router_from_tasklease_toml(shop: Path) -> None:
    (shop / "tasklease.toml").write_text('[worker]\nrouter = "myshop.tasks:routr"\n')
    process, marker = start_dev(shop, dev_flags())
    output, _ = process.communicate(timeout=60)
    assert output.splitlines() == [f"tasklease dev: {HINT}"]
    assert wait_gone(marker) == []


def test_gunicorn_boot_reports_the_typo_in_one_line_without_a_traceback(shop: Path) -> None:
    booted = subprocess.run(
        [sys.executable, "-m", "gunicorn", "--bind", "127.0.0.1:0", "tasklease.worker.wsgi:app"],
        cwd=shop,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(shop), os.environ.get("PYTHONPATH", "")]),
            "TASKLEASE_ROUTER": "myshop.tasks:routr",
            "TASKLEASE_STORE": "memory://",
            "TASKLEASE_AUTH": "none",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert booted.returncode != 0
    assert "Traceback" not in booted.stderr
    assert f"tasklease: {HINT}" in booted.stderr.splitlines()
