"""The import rules of the folders: the pure core does no I/O, the emulator (the oracle the
worker is tested against) imports nothing of the worker, and the shared plumbing belongs to
neither side. Each is checked in a fresh interpreter, by the modules an import loads."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import tasklease.emulator
import tasklease.plumbing
import tasklease.worker.core
from tests.checkout import ROOT

# What a pure module must never bring in: I/O, threads, web frameworks, Google's clients.
IMPURE = (
    "sqlite3",
    "socket",
    "threading",
    "flask",
    "werkzeug",
    "google",
    "grpc",
    "requests",
    "opentelemetry",
    "tasklease.worker.stores",
)


def submodules(package: object) -> list[str]:
    path = package.__path__  # type: ignore[attr-defined]
    prefix = package.__name__ + "."  # type: ignore[attr-defined]
    return sorted(name for _, name, _ in pkgutil.walk_packages(path, prefix))


def loaded_by(module: str) -> set[str]:
    probe = f"import json, sys, {module}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


def among(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m in names or m.startswith(tuple(f"{n}." for n in names)))


@pytest.mark.parametrize("module", submodules(tasklease.worker.core))
def test_a_core_module_loads_no_io_threads_or_frameworks(module: str) -> None:
    assert among(loaded_by(module), IMPURE) == []


@pytest.mark.parametrize("module", ["tasklease.protocol", "tasklease.errors", "tasklease.jobs"])
def test_the_shared_contract_loads_nothing_of_either_side(module: str) -> None:
    modules = loaded_by(module)
    assert among(modules, IMPURE) == []
    assert among(modules, ("tasklease.worker", "tasklease.producer", "tasklease.emulator")) == []


def test_the_cron_helper_loads_croniter_and_nothing_of_either_side() -> None:
    modules = loaded_by("tasklease.cron")
    assert among(modules, ("tasklease.worker", "tasklease.producer", "tasklease.emulator")) == []
    assert among(modules, ("flask", "google", "grpc", "sqlite3", "opentelemetry")) == []


def test_the_emulator_imports_nothing_of_the_worker() -> None:
    modules = loaded_by(", ".join(["tasklease.emulator", *submodules(tasklease.emulator)]))
    assert among(modules, ("tasklease.worker", "tasklease.producer")) == []


@pytest.mark.parametrize("module", submodules(tasklease.plumbing))
def test_the_plumbing_belongs_to_neither_side(module: str) -> None:
    modules = loaded_by(module)
    assert among(modules, ("tasklease.worker", "tasklease.emulator", "tasklease.producer")) == []


# Public classes that share a name on purpose: the emulator spells Google's names on its own
# (a Scheduler job, a Cloud Tasks request), and each options record stays in its module.
SHARED_CLASS_NAMES = {"Job", "Options", "TaskRequest"}


def modules_of(package: str) -> dict[str, Path]:
    """Every module of ``package`` in the checkout, by dotted name."""
    folder = ROOT.joinpath(*package.split("."))
    found = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def test_no_two_public_classes_share_a_name_by_accident() -> None:
    """Two unrelated classes of one name (two group commits, say) make every reader check
    which one an import means."""
    defined: dict[str, list[str]] = defaultdict(list)
    for module, path in modules_of("tasklease").items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined[node.name].append(module)
    shared = {name: where for name, where in defined.items() if len(where) > 1}
    assert set(shared) <= SHARED_CLASS_NAMES, shared


def test_no_module_is_longer_than_500_lines() -> None:
    """Modules split by concept stay small enough to read in one sitting."""
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "tasklease").rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > 500
    }
    assert long == {}
