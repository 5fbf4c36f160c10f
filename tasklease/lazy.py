"""Package faces that import what they export on first use, so importing a package is cheap.

A package lists ``{name: defining module}`` and assigns the two hooks PEP 562 reads::

    __getattr__, __dir__ = lazy_exports(__name__, {"Router": "tasklease.worker.handlers.router"})

Static tools read the same names from an ``if TYPE_CHECKING:`` import block beside it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, importing each export's module on first read."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        vars(sys.modules[package])[name] = value  # Later reads skip this hook.
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
