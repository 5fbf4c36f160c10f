"""The router ``tasklease dev`` serves: its argument, else ``[worker] router`` in
./tasklease.toml; checked in the dev process first, so a typo is one line, not gunicorn's
tracebacks from each of its workers."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from tasklease.errors import ConfigurationError

if TYPE_CHECKING:
    from tasklease.worker.handlers.router import HandlerSpec

CONFIG = Path("tasklease.toml")


def router_reference(argument: str | None, config: Path = CONFIG) -> str:
    """``argument``, else the router ``config`` names; ConfigurationError when neither."""
    if argument:
        return argument
    try:
        settings = tomllib.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigurationError(
            f"name your router (tasklease dev myapp.tasks:router), or set [worker] router "
            f"in ./{config}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{config}: {exc}") from None
    worker = settings.get("worker")
    reference = worker.get("router") if isinstance(worker, dict) else None
    if not isinstance(reference, str) or not reference:
        raise ConfigurationError(
            f"{config} has no [worker] router: name your router (tasklease dev myapp.tasks:router)"
        )
    return reference


def configured_router(config: Path = CONFIG) -> str | None:
    """The ``[worker] router`` of ``config``, or None when it has none or does not read."""
    try:
        return router_reference(None, config)
    except ConfigurationError:
        return None


def check_router(reference: str) -> list[HandlerSpec]:
    """Import the router as the worker will (the current directory first on the path), and
    return its handlers (those of the router a Flask app of create_app serves);
    ConfigurationError says what is wrong with the reference."""
    from tasklease.worker.handlers.router import Router  # noqa: PLC0415
    from tasklease.worker.serving.app import EXECUTOR_EXTENSION  # noqa: PLC0415
    from tasklease.worker.serving.router_reference import load_router  # noqa: PLC0415

    here = str(Path.cwd())
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        target = load_router(reference)
    finally:
        if added:
            sys.path.remove(here)
    if isinstance(target, Router):
        return list(target)
    executor = target.extensions.get(EXECUTOR_EXTENSION)
    return list(executor.router) if executor is not None else []
