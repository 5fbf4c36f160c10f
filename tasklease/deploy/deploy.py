#!/usr/bin/env python3
"""From zero to a running tasklease worker on Cloud Run, in one command.

    tasklease/deploy/deploy.py [--config tasklease/deploy/tasklease.toml] [--dry-run] [--teardown]

Reads one TOML file (see tasklease.toml beside this script) and, with the gcloud CLI: enables
the APIs, creates the Firestore database with TTL policies on the runs' expire_at and the locks'
lapses_at and the indexes the run listings need (or, with ``store = "postgresql"`` or
``"spanner"``, the Cloud SQL or Spanner database: tasklease.deploy.databases), the two
service accounts (the worker's
runtime identity, and the invoker that Cloud Tasks and Scheduler put in their OIDC tokens),
the queues, the worker on Cloud Run from source (private: --no-allow-unauthenticated) and the
Scheduler jobs, granting each identity only what it needs, on the narrowest resource that
takes the grant.

Every step first looks at what exists and changes only what differs, so a second run changes
nothing. --dry-run prints every command, in order, and runs none (not even the look-ups: it
plans as for an empty project). Needs only Python 3.11+ and gcloud.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

# Run as a script from a checkout (tasklease/deploy/deploy.py), the source defaults to it.
ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    # A script's own directory is sys.path[0] (Python docs, "sys.path"): there, this kit's
    # modules (config, gcloud, ...) would pass for top-level ones. tasklease itself is
    # importable in every install; a bare checkout gets its root on the path.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    if importlib.util.find_spec("tasklease") is None:
        sys.path.insert(0, str(ROOT))

from tasklease.deploy.code_jobs import code_jobs, configured_router, router_handlers  # noqa: E402
from tasklease.deploy.config import DEFAULT_CONFIG, Config, load_config  # noqa: E402
from tasklease.deploy.errors import DeployError  # noqa: E402
from tasklease.deploy.gcloud import Gcloud  # noqa: E402
from tasklease.deploy.plan import Deployer  # noqa: E402
from tasklease.deploy.source import (  # noqa: E402
    check_proxy_source,
    check_source,
    ensure_gcloudignore,
    ensure_procfile,
)


def run(
    config: Config,
    source: Path,
    gcloud: Gcloud | str = "gcloud",
    *,
    dry_run: bool = False,
    teardown: bool = False,
) -> None:
    """Deploy ``config`` with the worker built from ``source``, or tear it down: the one entry
    point of ``tasklease/deploy/deploy.py`` and ``tasklease deploy``. ``gcloud`` is the
    executable, or an adapter whose ``dry_run`` agrees. A source the worker could not start
    from is refused (DeployError) before any gcloud call; one without a Procfile gets
    tasklease's."""
    if isinstance(gcloud, str):
        gcloud = Gcloud(dry_run=dry_run, executable=gcloud)
    elif gcloud.dry_run != dry_run:
        raise ValueError(f"dry_run={dry_run}, but the gcloud adapter has dry_run={gcloud.dry_run}")
    source = source.resolve()
    deployer = Deployer(config, gcloud, source)
    if teardown:
        deployer.teardown()
        return
    problems = check_source(
        source, config.router, store=config.store, server=config.server
    ) or check_proxy_source(source, config)
    if problems:
        raise DeployError(
            f"the worker built from {source} could not start:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    ensure_procfile(source, dry_run=dry_run, server=config.server)
    ensure_gcloudignore(source, dry_run=dry_run)
    deployer.deploy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--source", type=Path, default=ROOT, help="the directory Cloud Run builds the worker from"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    parser.add_argument("--teardown", action="store_true", help="delete what deploy created")
    parser.add_argument("--gcloud", default="gcloud", help="the gcloud executable")
    args = parser.parse_args(argv)
    try:
        router = configured_router(args.config)
        declared = code_jobs(router_handlers(router, args.source, "deploy"))
        config = load_config(args.config, declared)
        run(config, args.source, args.gcloud, dry_run=args.dry_run, teardown=args.teardown)
    except DeployError as exc:
        return failed(exc)
    return 0


def failed(exc: DeployError) -> int:
    """Report ``exc`` as both command lines do, and give their exit status."""
    print(f"deploy: {exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
