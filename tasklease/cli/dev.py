"""``tasklease dev``: the emulator, a gunicorn worker for your router and the dashboard, in
the foreground, with one line a minute on what the emulator delivered to the worker.

That line is seen from the emulator (the one process that sees every attempt, whatever the
number of gunicorn workers): deliveries, their outcomes (the worker's ``X-Tasklease-Outcome``,
else the HTTP status) and the p50/p99 of the round trip, handler included.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import threading
from collections import Counter
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING

from tasklease import protocol
from tasklease.cli.common import (
    DEFAULT_DASHBOARD_PORT,
    Subcommands,
    add_command,
    log_to_terminal,
    stop_on_sigterm,
    wait,
)
from tasklease.cli.dashboard import serving_dashboard
from tasklease.cli.dev_outbox import dev_relay
from tasklease.cli.dev_router import check_router, router_reference
from tasklease.cli.dev_stop import interrupted_message, running
from tasklease.cli.emulator import add_emulator_options, serving_emulator
from tasklease.cli.ports import Port, first_clash
from tasklease.cli.store_choice import DEV_STORE_FILE, write_dev_store
from tasklease.errors import ConfigurationError
from tasklease.plumbing.url_secrets import has_password, shown_url
from tasklease.worker.handlers.declared_jobs import declared_jobs

if TYPE_CHECKING:
    from tasklease.emulator.sender import AttemptResult

NAME = "dev"
_log = logging.getLogger("tasklease.dev")


def register(commands: Subcommands) -> None:
    dev = add_command(commands, NAME, "emulator + scheduler + a gunicorn worker, foreground")
    dev.add_argument(
        "router",
        nargs="?",
        help="module:attribute of your tasklease.Router "
        "(default: [worker] router in ./tasklease.toml)",
    )
    dev.add_argument("--worker-port", type=int, default=8080, help="the worker's port")
    dev.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    dev.add_argument(
        "--store", default="sqlite:///.tasklease/runs.db", help="the worker's store URL"
    )
    dev.add_argument("--project", default="dev-project", help="the queue's project")
    dev.add_argument("--location", default="us-central1", help="the queue's location")
    dev.add_argument("--queue", default="default", help="the queue, created if missing")
    dev.add_argument(
        "--service-account",
        default="tasks@dev-project.iam.gserviceaccount.com",
        help="the account tasks, and Scheduler jobs naming none, are signed for; the one the "
        "worker accepts",
    )
    dev.add_argument(
        "--reload",
        action="store_true",
        help="restart the worker when your code changes (gunicorn --reload)",
    )
    add_emulator_options(dev)
    dev.add_argument(
        "--dashboard-port", type=int, default=DEFAULT_DASHBOARD_PORT, help="the dashboard's port"
    )


def run(args: argparse.Namespace) -> int:
    from tasklease.plumbing.serve import GunicornWorker  # noqa: PLC0415

    log_to_terminal()
    clash = first_clash(dev_ports(args))
    if clash:
        print(f"tasklease dev: {clash}", file=sys.stderr)
        return 1
    worker_url = f"http://127.0.0.1:{args.worker_port}"
    try:
        args.router = router_reference(args.router)
        # The router's schedules in code, calling this worker (a jobs file may override them).
        declared = [
            replace(job, url=f"{worker_url}{protocol.SCHEDULER_ROUTE_PREFIX}{job.name}")
            for job in declared_jobs(check_router(args.router))
        ]
    except ConfigurationError as exc:
        print(f"tasklease dev: {exc}", file=sys.stderr)
        return 1
    stop = stop_on_sigterm()
    log = logging.getLogger("tasklease.cli")
    store_url = write_dev_store(args.store)
    with serving_emulator(
        args, default_service_account=args.service_account, declared=declared
    ) as emulator:
        queue = f"projects/{args.project}/locations/{args.location}/queues/{args.queue}"
        if emulator.db.get_queue(queue) is None:
            emulator.create_queue(queue)
        env = {
            "TASKLEASE_PROJECT": args.project,
            "TASKLEASE_LOCATION": args.location,
            "TASKLEASE_QUEUE": args.queue,
            "TASKLEASE_WORKER_URL": worker_url,
            "TASKLEASE_AUDIENCE": worker_url,
            "TASKLEASE_SERVICE_ACCOUNT": args.service_account,
            "TASKLEASE_TASKS_ENDPOINT": emulator.url,
            "TASKLEASE_TASKS_GRPC_ENDPOINT": emulator.grpc_target,  # AsyncProducer
            "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": args.service_account,
            "TASKLEASE_OIDC_CERTS_URL": emulator.certs_url,
        }
        with (
            MinuteSummary(),
            GunicornWorker(
                args.router,
                store=store_url,
                auth="oidc",
                workers=args.workers,
                port=args.worker_port,
                env=env,
                log_path=None,
                stream_logs=True,
                extra_args=[
                    "--config",
                    "python:tasklease.plumbing.gunicorn_text_logs",
                    *(["--reload"] if args.reload else []),
                ],
                own_session=True,
            ) as worker,
            serving_dashboard(
                store_url, "127.0.0.1", args.dashboard_port, env, declared=declared
            ) as board,
            dev_relay(store_url, env),
        ):
            log.info("worker for %s on %s; queue %s", args.router, worker_url, queue)
            log.info("dashboard on %s", board)
            for job in list(emulator.scheduler.jobs.values()):
                log.info("scheduler job %s: %s (%s)", job.name, job.schedule, job.time_zone)
            print(
                f"\nCloud Tasks emulator: REST {emulator.url}, gRPC {emulator.grpc_target}"
                "\nEnqueue from another shell with:\n"
                + "".join(
                    f"  export {name}={value}\n"
                    for name, value in env.items()
                    if name.startswith("TASKLEASE_")
                    and "ALLOWED" not in name
                    and "CERTS" not in name
                )
                + _store_export(store_url)
                + f"\nDashboard (runs, stuck, release, replay): {board}\n",
                flush=True,
            )
            code = wait(stop)
            executing, now = running(store_url)
            if executing:
                print(interrupted_message(executing, now), file=sys.stderr, flush=True)
                worker.kill()  # Their leases lapse either way: no graceful wait, no alarm.
            return code


def _store_export(store_url: str) -> str:
    """The banner's line for the read commands' store: never the password itself (a
    terminal's scrollback, a shared screen); they find the URL in this folder anyway."""
    if not has_password(store_url):
        return f"  export {protocol.ENV_STORE}={store_url}  # for tasklease runs / locks\n"
    return (
        f"  # {protocol.ENV_STORE}: {shown_url(store_url)} (password hidden); tasklease runs "
        f"/ locks run here read it from {DEV_STORE_FILE}\n"
    )


def dev_ports(args: argparse.Namespace) -> list[Port]:
    """Every port ``tasklease dev`` listens on, with the flag that moves it."""
    grpc = args.grpc_port if args.grpc_port is not None else (args.port + 1 if args.port else 0)
    return [
        Port(args.host, args.port, "the emulator's REST API", "--port"),
        Port("127.0.0.1", grpc, "the emulator's gRPC API", "--grpc-port"),
        Port("127.0.0.1", args.worker_port, "the worker", "--worker-port"),
        Port("127.0.0.1", args.dashboard_port, "the dashboard", "--dashboard-port"),
    ]


class MinuteSummary:
    """Collects attempts from the emulator and logs a summary every ``interval`` seconds."""

    def __init__(self, interval: float = 60.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._outcomes: Counter[str] = Counter()
        self._latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tasklease-summary", daemon=True)

    def observe(self, queue: str, result: AttemptResult) -> None:
        """An emulator listener: count one attempt."""
        if result.outcome:
            outcome = result.outcome
        elif result.status is not None:
            outcome = f"HTTP {result.status}"
        else:
            outcome = "no answer"
        with self._lock:
            self._outcomes[outcome] += 1
            self._latencies.append(result.duration_ms)

    def take_line(self) -> str:
        """The summary of the attempts since the last line, and start counting afresh."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, Counter()
            latencies, self._latencies = sorted(self._latencies), []
        if not latencies:
            return "last minute: no deliveries"
        counts = ", ".join(f"{name} {count}" for name, count in outcomes.most_common())
        return (
            f"last minute: {len(latencies)} deliver{'y' if len(latencies) == 1 else 'ies'} "
            f"({counts}); "
            f"p50 {_percentile(latencies, 50):.1f} ms, p99 {_percentile(latencies, 99):.1f} ms"
        )

    def __enter__(self) -> MinuteSummary:
        from tasklease.emulator import metrics as emulator_metrics  # noqa: PLC0415

        emulator_metrics.add_listener(self.observe)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        from tasklease.emulator import metrics as emulator_metrics  # noqa: PLC0415

        emulator_metrics.remove_listener(self.observe)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            _log.info(self.take_line())


def _percentile(ordered: list[float], percent: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list."""
    return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]
