"""The producer's modules import each other without a cycle, type-checking imports included:
errors.py named EnqueueResult from producer.py, which imports errors.py (results.py now holds
both EnqueueResult and FanOutIncomplete)."""

from __future__ import annotations

import ast
from pathlib import Path

import tasklease.producer
from tasklease import EnqueueResult, FanOutIncomplete
from tasklease.producer import EnqueueError
from tasklease.producer import EnqueueResult as ProducerResult

PACKAGE = Path(tasklease.producer.__file__).parent


def imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports anywhere (``if TYPE_CHECKING:`` too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("tasklease.producer."):
                found.add(node.module.rsplit(".", 1)[-1])
            elif node.module == "tasklease.producer":
                found.update(alias.name for alias in node.names)
    return found & {p.stem for p in PACKAGE.glob("*.py")}


def test_the_producer_modules_import_each_other_without_a_cycle() -> None:
    graph = {p.stem: imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, " -> ".join([*path, module])
        if module in done:
            return
        for imported in sorted(graph.get(module, set())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_public_names_stay_importable() -> None:
    assert ProducerResult is EnqueueResult
    assert issubclass(FanOutIncomplete, EnqueueError)
