"""``tasklease deploy``: the deploy kit (``tasklease.deploy.deploy.run``) for a project of your own.

    tasklease deploy --init [--router myapp.tasks:router]   # writes ./tasklease.toml
    tasklease deploy --dry-run                               # prints every command
    tasklease deploy                                         # deploys ./ to Cloud Run
    tasklease deploy --teardown

The source (``--source``, default ``.``) is what Cloud Run builds the worker from; it is
checked before any gcloud call, and given tasklease's Procfile if it has none.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tasklease.cli.common import Subcommands, add_command
from tasklease.deploy.code_jobs import code_jobs, configured_router, router_handlers
from tasklease.worker.core.identity import Kind

if TYPE_CHECKING:
    from tasklease.worker.handlers.router import HandlerSpec

NAME = "deploy"
CONFIG_NAME = "tasklease.toml"
DEFAULT_ROUTER = "myapp.tasks:router"


def register(commands: Subcommands) -> None:
    help = "deploy your project's worker to Cloud Run (see --init, --dry-run)"
    add_arguments(add_command(commands, NAME, help))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source", type=Path, default=Path("."), help="your project's directory (default: .)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"the deploy config (default: SOURCE/{CONFIG_NAME})",
    )
    parser.add_argument("--init", action="store_true", help="write a commented config and stop")
    parser.add_argument(
        "--router",
        default=None,
        help=f"with --init: your Router, module:attribute (default: {DEFAULT_ROUTER})",
    )
    parser.add_argument(
        "--project",
        default=None,
        help="with --init: the Google Cloud project (default: the template's my-project)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    parser.add_argument("--teardown", action="store_true", help="delete what deploy created")
    parser.add_argument("--gcloud", default="gcloud", help="the gcloud executable")


def run(args: argparse.Namespace) -> int:
    config = args.config if args.config is not None else args.source / CONFIG_NAME
    if args.init:
        return init(config, router=args.router or DEFAULT_ROUTER, project=args.project)
    if not config.exists():
        print(
            f"tasklease deploy: no {config}: write one with `tasklease deploy --init` "
            "(then set project, region and router)",
            file=sys.stderr,
        )
        return 2
    # Imported here: only this command needs the kit.
    from tasklease.deploy import deploy as kit  # noqa: PLC0415
    from tasklease.deploy.config import load_config  # noqa: PLC0415
    from tasklease.deploy.errors import DeployError  # noqa: PLC0415
    from tasklease.deploy.source import check_source  # noqa: PLC0415

    try:
        handlers = router_handlers(configured_router(config), args.source, "tasklease deploy")
        loaded = load_config(config, declared=code_jobs(handlers))
        if not check_source(
            args.source, loaded.router, store=loaded.store, server=loaded.server
        ) and (
            problems := unknown_job_handlers(
                loaded.router, [job.name for job in loaded.jobs], handlers
            )
        ):
            head = "tasklease deploy: [[job]] tables name handlers the router lacks:"
            print("\n  - ".join([head, *problems]), file=sys.stderr)
            return 2
        kit.run(
            loaded,
            args.source,
            args.gcloud,
            dry_run=args.dry_run,
            teardown=args.teardown,
        )
    except DeployError as exc:
        return kit.failed(exc)
    return 0


def unscheduled_handlers(router: str, source: Path) -> list[str] | None:
    """The names of ``router``'s scheduled handlers with no schedule in code, or None when it
    does not import here."""
    handlers = router_handlers(router, source, "tasklease deploy")
    if handlers is None:
        return None
    return sorted(
        spec.name for spec in handlers if spec.kind is Kind.SCHEDULER and spec.schedule is None
    )


def unknown_job_handlers(
    router: str, jobs: list[str], handlers: list[HandlerSpec] | None
) -> list[str]:
    """Each ``[[job]]`` name that no scheduled handler of ``router`` (its ``handlers``, None
    when it did not import) has: its every run would be answered 404 (each job calls
    ``/jobs/<name>``)."""
    if handlers is None:
        return []
    names = sorted(spec.name for spec in handlers if spec.kind is Kind.SCHEDULER)
    known = ", ".join(names) or "none"
    return [
        f"job {job}: {router} has no @router.scheduled({job!r}) (it has: {known})"
        for job in jobs
        if job not in names
    ]


def init(config: Path, *, router: str, project: str | None = None) -> int:
    """Write the deploy kit's commented example, made the user's: their router, no job."""
    if config.exists():
        print(f"tasklease deploy: {config} exists; not overwritten", file=sys.stderr)
        return 2
    # A [[job]] only for the handlers with no schedule in code: a deploy reads the others.
    unscheduled = unscheduled_handlers(router, config.parent) or []
    config.write_text(template(router, project, unscheduled))
    print(f"wrote {config}: set project, region and your queues, then `tasklease deploy --dry-run`")
    return 0


def template(router: str, project: str | None = None, scheduled: list[str] | None = None) -> str:
    from tasklease.deploy.config import DEFAULT_CONFIG  # noqa: PLC0415

    text = DEFAULT_CONFIG.read_text()
    text = re.sub(r'(?m)^router = "[^"]*"', f'router = "{router}"', text, count=1)
    if project:
        text = re.sub(r'(?m)^project = "[^"]*"', f'project = "{project}"', text, count=1)
    header, _, jobs = text.partition("\n[[job]]")
    # The example's job calls a handler the user may not have: keep it, commented out.
    commented = "\n".join(f"# {line}" if line else "#" for line in f"[[job]]{jobs}".splitlines())
    intro = (
        "# tasklease deploy reads this file (see `tasklease deploy --help`). Times in seconds.\n"
        '# Every Cloud Scheduler job needs a handler: @router.scheduled("name").\n'
    )
    body = re.sub(r"\A(#[^\n]*\n)+\n*", "", header)  # The kit's own header comment.
    if scheduled:  # A job per scheduled handler of the router, to uncomment once scheduled.
        jobs = "".join(
            f'#\n# [[job]]\n# name = "{name}"\n# schedule = "0 3 * * *"  # when it runs: set it\n'
            '# time_zone = "Etc/UTC"\n'
            for name in scheduled
        )
        heading = "# Your router's scheduled handlers, each a job once uncommented:"
        return f"{intro}\n{body}\n\n{heading}\n{jobs}"
    return f"{intro}\n{body}\n\n# Uncomment for a Scheduler job:\n{commented}\n"
