"""The FastAPI example (examples/fastapi_app) as a new user gets it: tasklease[asgi] and the
app installed into a fresh virtual environment from a clean copy of this checkout, its own
tests run there (a real uvicorn server), and uvicorn serving its factory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checkout import install_example, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fastapi_app(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh venv's bin directory, the example's project directory)."""
    installed = install_example(tmp_path_factory.mktemp("fastapi"), "fastapi_app", extra="asgi")
    return installed.bin_dir, installed.app


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
