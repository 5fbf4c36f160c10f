"""One installed namespace: the wheel holds only ``tasklease``, nothing a user's project can
shadow, and importing it loads only what the configured features need."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import tasklease
from tests.support.checkout import ROOT, clean_copy

BIN = Path(sys.executable).parent
SHADOWED = ("worker", "producer", "emulator", "deploy")


def imported_after(code: str, cwd: Path | None = None) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = textwrap.dedent(code) + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(
        m for m in modules if m in prefixes or m.startswith(tuple(f"{p}." for p in prefixes))
    )


def test_the_everyday_api_is_importable_from_the_top() -> None:
    from tasklease import (  # noqa: PLC0415
        EnqueueResult,
        LeaseLost,
        PermanentFailure,
        Producer,
        Router,
        TaskContext,
        create_app,
    )
    from tasklease.producer import Producer as ProducerFromSubpackage  # noqa: PLC0415
    from tasklease.worker import Router as RouterFromSubpackage  # noqa: PLC0415

    assert Router is RouterFromSubpackage and Producer is ProducerFromSubpackage
    assert callable(create_app) and issubclass(PermanentFailure, Exception)
    assert {EnqueueResult.__name__, LeaseLost.__name__, TaskContext.__name__} <= set(
        tasklease.__all__
    )
    for name in tasklease.__all__:
        assert getattr(tasklease, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        tasklease.Nope  # noqa: B018


def test_the_version_is_the_distribution_version() -> None:
    from importlib.metadata import version  # noqa: PLC0415

    assert tasklease.__version__ == version("tasklease")
    shown = subprocess.run(
        [BIN / "tasklease", "--version"], capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == f"tasklease {tasklease.__version__}"


def test_a_bare_tasklease_prints_its_help() -> None:
    shown = subprocess.run([BIN / "tasklease"], capture_output=True, text=True, check=False)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: tasklease") and "dev" in shown.stdout


def test_a_bare_import_of_tasklease_loads_nothing_heavy() -> None:
    modules = imported_after("import tasklease")
    heavy = ("flask", "werkzeug", "google", "grpc", "opentelemetry", "requests", "sqlite3")
    assert loaded(modules, heavy) == []
    assert loaded(modules, ("tasklease",)) == ["tasklease", "tasklease.lazy"]


def test_a_memory_store_worker_loads_only_what_it_uses() -> None:
    modules = imported_after(
        """
        from tasklease import MemoryStore, Router, create_app
        router = Router()
        router.task("noop")(lambda payload, ctx: {"ok": True})
        client = create_app(router, store=MemoryStore(), auth="none").test_client()
        answer = client.post("/tasks/noop", json={}, headers={
            "X-CloudTasks-QueueName": "q", "X-CloudTasks-TaskName": "t",
            "X-CloudTasks-TaskRetryCount": "0", "X-CloudTasks-TaskExecutionCount": "0",
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        })
        assert answer.status_code == 200, answer.get_data(as_text=True)
        """
    )
    unused = (
        "tasklease.producer",  # The Cloud Tasks client, for replays and fan-out only.
        "tasklease.emulator",
        "tasklease.worker.dashboard",
        "tasklease.worker.targets",
        "tasklease.worker.stores.sqlite.store",
        "tasklease.worker.core.queries",  # The operators' listing of runs.
        "tasklease.plumbing.otel_setup",  # Nothing asks for an SDK.
        "tasklease.worker.stores.firestore.store",
        "google",  # google-auth too: it verifies tokens, and authentication is off here.
        "requests",
        "cachecontrol",
        "cryptography",
        "grpc",
        # Nothing configured OpenTelemetry, so its API too stays out: every span and metric
        # would be a no-op, and the log line reads the caller's trace itself.
        "opentelemetry",
        "typing_extensions",
        "sqlite3",
        "croniter",
        "waitress",
    )
    assert loaded(modules, unused) == []


def test_the_designs_folder_names_are_no_import_names_of_the_install(tmp_path: Path) -> None:
    """worker, producer, emulator and deploy are tasklease subpackages, never top-level names."""
    for name in SHADOWED:
        found = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import importlib.util; print(importlib.util.find_spec({name!r}))",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        assert found.stdout.strip() == "None", name


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_package(tmp_path: Path) -> None:
    checkout = clean_copy(tmp_path / "checkout")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", tmp_path / "dist",
         checkout],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (tmp_path / "dist").glob("tasklease-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [top_level] = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        declared = archive.read(top_level).decode().split()
    tops = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert tops == {"tasklease"} and declared == ["tasklease"]
    for shipped in (
        "tasklease/py.typed",
        "tasklease/deploy/tasklease.toml",
        "tasklease/demo/shop.py",
        "tasklease/worker/dashboard/templates/tasklease_dashboard/base.html",
    ):
        assert shipped in names, shipped


def test_the_checkout_tracks_no_symbolic_links() -> None:
    """Each module has one path: editors and grep show it once, and git on Windows checks
    out no link as a text file."""
    listed = subprocess.run(
        ["git", "ls-files", "--stage"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    links = [line.split("\t", 1)[1] for line in listed.stdout.splitlines() if line[:6] == "120000"]
    assert links == []
