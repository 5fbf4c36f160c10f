"""The example shop and ``tasklease demo``, shipped in the package so the demo runs from a wheel.

:mod:`tasklease.demo.shop` is the router the demo serves; :mod:`tasklease.demo.run` runs it end
to end against the local emulator with faults injected.
"""

from __future__ import annotations

import importlib.util

__all__ = ["has_workflows_client"]


def has_workflows_client() -> bool:
    """Whether google-cloud-workflows (``tasklease[workflows]``) is installed: the demo's proxy
    job needs it, and is left out without it."""
    return importlib.util.find_spec("google.cloud.workflows") is not None
