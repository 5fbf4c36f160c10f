"""The FastAPI example (examples/fastapi_app) as a new user gets it: tasklease[asgi] and the
app installed into a fresh virtual environment from a clean copy of this checkout, its own
tests run there (a real uvicorn server), and uvicorn serving its factory."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.docs.test_userapp import run
from tests.support.checkout import clean_copy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fastapi_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh venv's bin directory, the example's project directory)."""
    tmp = tmp_path_factory.mktemp("fastapi")
    checkout = clean_copy(tmp / "tasklease")
    app = shutil.copytree(checkout / "examples" / "fastapi_app", tmp / "fastapi_app")
    venv = tmp / "venv"
    created = run(sys.executable, "-m", "venv", venv, cwd=tmp)
    assert created.returncode == 0, created.stderr
    bin_dir = venv / "bin"
    installed = run(
        # --no-compile: pip's byte-compiling of every dependency is most of a cached install.
        bin_dir / "python", "-m", "pip", "install", "--quiet", "--no-compile",
        f"{checkout}[asgi]", f"{app}[test]",
        cwd=tmp,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return bin_dir, app


def test_the_examples_own_tests_pass_in_a_fresh_environment(
    fastapi_app: tuple[Path, Path],
) -> None:
    bin_dir, app = fastapi_app
    result = run(bin_dir / "pytest", "-q", "-p", "no:cacheprovider", cwd=app)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout


def test_a_plain_install_of_the_example_brings_uvicorn_and_the_asgi_worker(
    fastapi_app: tuple[Path, Path],
) -> None:
    bin_dir, app = fastapi_app
    probe = run(
        bin_dir / "python", "-c",
        "import uvicorn, anyio, tasklease.worker.asgi, shop.app; print('ok')", cwd=app,
    )  # fmt: skip
    assert probe.stdout.strip() == "ok", probe.stderr
    assert (bin_dir / "uvicorn").exists()
