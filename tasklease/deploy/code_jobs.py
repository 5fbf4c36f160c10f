"""The Scheduler jobs a project's router declares in code (``@router.scheduled(...,
schedule=...)``), for a deploy: the router the config's ``[worker] router`` names, imported
with the source first on the path. One that does not import here (the project's own
dependencies may be missing from this environment) is reported, and the deploy goes on with
the config's [[job]] tables alone."""

from __future__ import annotations

import importlib
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasklease.jobs import Job
    from tasklease.worker.handlers.router import HandlerSpec


def configured_router(config: Path) -> str | None:
    """The ``[worker] router`` of ``config``, if it reads (load_config judges the rest)."""
    try:
        worker = tomllib.loads(config.read_text()).get("worker")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    router = worker.get("router") if isinstance(worker, dict) else None
    return router if isinstance(router, str) and router else None


def router_handlers(router: str | None, source: Path, who: str) -> list[HandlerSpec] | None:
    """The handlers of ``router`` (``module:attribute``), or None when there is none or it
    does not import here (said on stderr, ``who`` first)."""
    if router is None:
        return None
    module_name, _, attribute = router.partition(":")
    sys.path.insert(0, str(source.resolve()))
    try:
        return list(getattr(importlib.import_module(module_name), attribute))
    except Exception as exc:  # The user's module: anything it raises means "not checkable".
        print(
            f"{who}: {router} does not import here ({type(exc).__name__}: {exc}): "
            "not checking [[job]] names, and deploying no schedule declared in code",
            file=sys.stderr,
        )
        return None
    finally:
        sys.path.remove(str(source.resolve()))


def code_jobs(handlers: list[HandlerSpec] | None) -> list[Job]:
    """The jobs ``handlers`` declare (none when the router did not import)."""
    from tasklease.worker.handlers.declared_jobs import declared_jobs  # noqa: PLC0415

    return declared_jobs(handlers or [])
