"""The router ``tasklease dev`` serves: its argument, else ``[worker] router`` in
./tasklease.toml; checked in the dev process first, so a typo is one line, not gunicorn's
tracebacks from each of its workers."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from tasklease.errors import ConfigurationError

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


def check_router(reference: str) -> None:
    """Import the router as the worker will (the current directory first on the path);
    ConfigurationError says what is wrong with the reference."""
    from tasklease.worker.wsgi import load_router  # noqa: PLC0415

    here = str(Path.cwd())
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        load_router(reference)
    finally:
        if added:
            sys.path.remove(here)
