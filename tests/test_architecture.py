"""The import rules of the folders: the pure core does no I/O, the emulator (the oracle the
worker is tested against) imports nothing of the worker, and the shared plumbing belongs to
neither side, each checked in a fresh interpreter by the modules an import loads; the
producer, the outbox and the emulator import no worker module even lazily or for types, read
from their source; and no two modules of tasklease import each other, however indirectly."""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import tasklease.emulator
import tasklease.plumbing
import tasklease.worker.core
from tests.support.checkout import ROOT
from tests.support.fresh_python import modules_loaded_by

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


def among(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m in names or m.startswith(tuple(f"{n}." for n in names)))


@pytest.mark.parametrize("module", submodules(tasklease.worker.core))
def test_a_core_module_loads_no_io_threads_or_frameworks(module: str) -> None:
    assert among(modules_loaded_by(module), IMPURE) == []


@pytest.mark.parametrize("module", ["tasklease.protocol", "tasklease.errors", "tasklease.jobs"])
def test_the_shared_contract_loads_nothing_of_either_side(module: str) -> None:
    modules = modules_loaded_by(module)
    assert among(modules, IMPURE) == []
    assert among(modules, ("tasklease.worker", "tasklease.producer", "tasklease.emulator")) == []


def test_the_cron_helper_loads_croniter_and_nothing_of_either_side() -> None:
    modules = modules_loaded_by("tasklease.cron")
    assert among(modules, ("tasklease.worker", "tasklease.producer", "tasklease.emulator")) == []
    assert among(modules, ("flask", "google", "grpc", "sqlite3", "opentelemetry")) == []


def test_the_emulator_imports_nothing_of_the_worker() -> None:
    modules = modules_loaded_by(", ".join(["tasklease.emulator", *submodules(tasklease.emulator)]))
    assert among(modules, ("tasklease.worker", "tasklease.producer")) == []


@pytest.mark.parametrize("module", submodules(tasklease.plumbing))
def test_the_plumbing_belongs_to_neither_side(module: str) -> None:
    modules = modules_loaded_by(module)
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


def imported_names(module: str, path: Path) -> set[str]:
    """Every module ``module`` imports anywhere in its source: at the top, inside functions,
    under ``TYPE_CHECKING``; relative imports resolved, and ``from x import y`` as ``x.y``
    when ``y`` is a submodule, else as ``x`` (and the module a lazy export ``y`` loads)."""
    return names_in(ast.parse(path.read_text()), package_of(module, path))


def package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def names_in(tree: ast.AST, package: str) -> set[str]:
    """The modules the import statements in ``tree`` name, read in ``package``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                if is_module(f"{base}.{alias.name}"):
                    names.add(f"{base}.{alias.name}")  # Loading it loads ``base`` anyway.
                else:
                    names.update((base, f"{base}.{alias.name}", lazily_from(base, alias.name)))
    return names - {""}


def is_module(name: str) -> bool:
    """Whether ``name`` is a module of the checkout (another project's names may be either)."""
    if name != "tasklease" and not name.startswith("tasklease."):
        return False
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def lazily_from(package: str, name: str) -> str:
    """The module a lazy export of ``package`` (``from tasklease import Router``) loads."""
    if package != "tasklease" and not package.startswith("tasklease."):
        return ""
    try:
        exports = vars(importlib.import_module(package)).get("_EXPORTS", {})
    except ImportError:
        return ""
    return str(exports.get(name, ""))


@pytest.mark.parametrize("role", ["tasklease.producer", "tasklease.outbox", "tasklease.emulator"])
def test_the_producer_outbox_and_emulator_import_no_worker_module(role: str) -> None:
    """Not even lazily or for types only: what they share with the worker lives in
    ``tasklease.plumbing`` or the shared contract."""
    reaching = {
        module: sorted(
            name
            for name in imported_names(module, path)
            if name == "tasklease.worker" or name.startswith("tasklease.worker.")
        )
        for module, path in modules_of(role).items()
    }
    assert {module: names for module, names in reaching.items() if names} == {}


def test_the_import_scan_sees_lazy_typing_and_relative_imports(tmp_path: Path) -> None:
    source = tmp_path / "tracing.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from tasklease.worker.handlers.router import Router\n"
        "def later():\n    import tasklease.worker.observe.telemetry\n"
        "from ..worker import stores\n"
        "from tasklease import create_app\n"
    )
    found = imported_names("tasklease.producer.tracing", source)
    assert {"tasklease.worker.handlers.router", "tasklease.worker.observe.telemetry"} <= found
    assert "tasklease.worker.stores" in found
    assert "tasklease.worker.serving.app" in found  # Through tasklease's lazy exports.


def import_graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of ``package`` it imports, anywhere."""
    return {module: set(imports) for module, imports in scanned_graph(package).items()}


@functools.cache
def scanned_graph(package: str) -> Mapping[str, frozenset[str]]:
    found = modules_of(package)
    return {
        module: frozenset(imported_names(module, path) & set(found)) - {module}
        for module, path in found.items()
    }


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of two modules or more
    (Tarjan's algorithm, without recursion), each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, pending = work[-1]
            step = next(pending, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == module:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return sorted(found)


def test_no_two_modules_import_each_other_even_lazily_or_for_types() -> None:
    """An import graph without loops can be read bottom up: each module makes sense with
    only what it imports in mind. What two modules share goes into a lower module (or a
    Protocol the higher one satisfies), never a deferred import back."""
    assert circles(import_graph("tasklease")) == []


def type_only_imports(module: str, path: Path) -> set[str]:
    """The modules ``module`` imports inside ``if TYPE_CHECKING:`` blocks."""
    package = package_of(module, path)
    return {
        name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for name in names_in(statement, package)
    }


def test_no_module_imports_its_own_importer_for_types() -> None:
    """A type-only import back to the module that imports you is the trace of a split that
    left its host behind: the shared type belongs below both."""
    graph = import_graph("tasklease")
    reachable = {module: reached_from(graph, module) for module in graph}
    back = sorted(
        (module, typed)
        for module, path in modules_of("tasklease").items()
        for typed in type_only_imports(module, path)
        if typed in graph and typed != module and module in reachable[typed]
    )
    assert back == []


def reached_from(graph: Mapping[str, Iterable[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def test_the_circle_finder_sees_a_loop_of_three_and_leaves_a_chain_alone() -> None:
    loop = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(loop) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert reached_from(loop, "d") == {"a", "b", "c"}


def test_the_type_only_scan_reads_typing_blocks_alone(tmp_path: Path) -> None:
    source = tmp_path / "handles.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from tasklease.worker.core.identity import Kind\n"
        "if TYPE_CHECKING:\n    from .router import Router\n"
    )
    found = type_only_imports("tasklease.worker.handlers.handles", source)
    assert "tasklease.worker.handlers.router" in found
    assert "tasklease.worker.core.identity" not in found


def test_the_protocol_model_imports_only_the_core_and_the_standard_library() -> None:
    """The bounded model explores the pure rules: no store, no I/O, nothing to install."""
    module = "tasklease.testing.model"
    names = imported_names(module, modules_of("tasklease.testing")[module])
    outside = sorted(
        name
        for name in names
        if name.split(".")[0] not in sys.stdlib_module_names
        and not (name == "tasklease.worker.core" or name.startswith("tasklease.worker.core."))
    )
    assert outside == []
