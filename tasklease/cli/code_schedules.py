"""The schedules a router declares in code, for the commands that check jobs for missed runs
(``tasklease runs stuck``, ``tasklease dashboard``): the router named by ``--router``, else
``$TASKLEASE_ROUTER``, else the ``[worker] router`` of ./tasklease.toml."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, TextIO

from tasklease import protocol
from tasklease.cli.dev_router import CONFIG, check_router, configured_router
from tasklease.errors import ConfigurationError

if TYPE_CHECKING:
    from tasklease.jobs import Job


def add_router_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--router",
        default=None,
        help="module:attribute of the Router whose schedules in code are checked too "
        f"(default: ${protocol.ENV_ROUTER}, else [worker] router in ./{CONFIG})",
    )


def code_schedules(reference: str | None, err: TextIO = sys.stderr) -> list[Job]:
    """The jobs the router declares in code. A router named by ``reference`` that does not
    import is a ConfigurationError; one found by default is only warned about on ``err``
    (the commands still check the file's jobs), and no router at all declares none."""
    from tasklease.worker.handlers.declared_jobs import declared_jobs  # noqa: PLC0415

    if reference:
        try:
            return declared_jobs(check_router(reference))
        except ImportError as exc:
            raise ConfigurationError(f"{reference} does not import: {exc}") from None
    found = os.environ.get(protocol.ENV_ROUTER) or configured_router()
    if not found:
        return []
    try:
        return declared_jobs(check_router(found))
    except Exception as exc:  # The user's module: anything it raises means "not checkable".
        print(f"not checking the schedules in code of {found}: {exc}", file=err)
        return []
