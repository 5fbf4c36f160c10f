"""The ``tasklease`` command line: the demo, the local emulator and dev stack, deploys, runs."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

from tasklease import __version__, deploy_cli, locks, runs
from tasklease.plumbing.loopback import is_loopback_url
from tasklease.worker.logs import configure_logging

DEFAULT_EMULATOR_PORT = 8123
DEFAULT_DASHBOARD_PORT = 8090


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its flags."""
    parser = argparse.ArgumentParser(prog="tasklease", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tasklease {__version__}")
    commands = parser.add_subparsers(dest="command")

    demo = commands.add_parser("demo", help="run the example shop end to end, faults injected")
    demo.add_argument("--orders", type=int, default=200)
    demo.add_argument("--customers", type=int, default=25)
    demo.add_argument("--duplicate-probability", type=float, default=0.2)
    demo.add_argument("--lost-response-probability", type=float, default=0.2)
    demo.add_argument("--seed", type=int, default=None)
    demo.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")

    emulator = commands.add_parser("emulator", help="serve the local Cloud Tasks emulator")
    _emulator_options(emulator, port=DEFAULT_EMULATOR_PORT)

    scheduler = commands.add_parser("scheduler", help="drive the emulator's Cloud Scheduler")
    scheduler_commands = scheduler.add_subparsers(dest="scheduler_command", required=True)
    run = scheduler_commands.add_parser("run", help="run a job now, like gcloud scheduler jobs run")
    run.add_argument("job")
    run.add_argument("--emulator", default=f"http://127.0.0.1:{DEFAULT_EMULATOR_PORT}")

    dev = commands.add_parser("dev", help="emulator + scheduler + a gunicorn worker, foreground")
    dev.add_argument("router", help="module:attribute of your tasklease.Router")
    dev.add_argument("--worker-port", type=int, default=8080)
    dev.add_argument("--workers", type=int, default=2)
    dev.add_argument("--store", default="sqlite:///.tasklease/runs.db")
    dev.add_argument("--project", default="dev-project")
    dev.add_argument("--location", default="us-central1")
    dev.add_argument("--queue", default="default")
    dev.add_argument("--service-account", default="tasks@dev-project.iam.gserviceaccount.com")
    _emulator_options(dev, port=DEFAULT_EMULATOR_PORT)

    dev.add_argument("--dashboard-port", type=int, default=DEFAULT_DASHBOARD_PORT)

    deploy = commands.add_parser(
        "deploy", help="deploy your project's worker to Cloud Run (see --init, --dry-run)"
    )
    deploy_cli.add_arguments(deploy)

    runs.add_parser(commands)
    locks.add_parser(commands)

    board = commands.add_parser("dashboard", help="serve the operators' web page over the store")
    board.add_argument("--store", default=None, help="store URL (default: $TASKLEASE_STORE)")
    board.add_argument("--host", default="127.0.0.1")
    board.add_argument("--port", type=int, default=DEFAULT_DASHBOARD_PORT)
    board.add_argument(
        "--allow-host",
        action="append",
        default=[],
        help="another Host header name to answer (loopback names and --host always are)",
    )
    board.add_argument(
        "--schedules", type=Path, help="[[job]] tables, for stuck jobs (default: ./tasklease.toml)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "deploy":
        return deploy_cli.run(args)
    if args.command == "runs":
        return runs.run(args)
    if args.command == "locks":
        return locks.run(args)
    if args.command == "dashboard":
        configure_logging()
        return _dashboard(args)
    if args.command == "demo":
        from tasklease.demo.run import DemoSettings, run_demo  # noqa: PLC0415 - heavy imports.

        return run_demo(
            DemoSettings(
                args.orders,
                args.customers,
                args.duplicate_probability,
                args.lost_response_probability,
                args.seed,
                args.workers,
            )
        )
    if args.command == "scheduler":
        response = requests.post(  # JSON: the emulator refuses other state changes.
            f"{args.emulator}/emulator/scheduler/jobs/{args.job}:run", json={}, timeout=10
        )
        print(response.text.strip())
        return 0 if response.ok else 1
    os.environ.setdefault("TASKLEASE_LOG_FORMAT", "text")  # A terminal; gunicorn inherits it.
    configure_logging()
    if args.command == "emulator":
        return _serve(args, worker=None)
    return _serve(args, worker=args)


def _emulator_options(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        help="another Host header name to answer (loopback names and --host always are)",
    )
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument(
        "--grpc-port", type=int, default=None, help="Cloud Tasks over gRPC (default: --port + 1)"
    )
    parser.add_argument("--data-dir", type=Path, default=Path(".tasklease/emulator"))
    parser.add_argument(
        "--dedup-window",
        type=float,
        default=3600.0,
        help="seconds a task name stays taken after the task ran or was deleted",
    )
    parser.add_argument("--duplicate-probability", type=float, default=0.0)
    parser.add_argument("--lost-response-probability", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--scheduler-config", type=Path, default=None, help="TOML file of [[job]] tables"
    )


def _serve(args: argparse.Namespace, worker: argparse.Namespace | None) -> int:
    from tasklease.dev_summary import MinuteSummary  # noqa: PLC0415
    from tasklease.emulator import CloudTasksEmulator, Faults, load_jobs  # noqa: PLC0415
    from tasklease.plumbing.serve import GunicornWorker  # noqa: PLC0415

    jobs = load_jobs(args.scheduler_config) if args.scheduler_config else []
    faults = Faults(args.duplicate_probability, args.lost_response_probability, args.seed)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log = logging.getLogger("tasklease.cli")
    with CloudTasksEmulator(
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        grpc_port=args.grpc_port,
        dedup_window=args.dedup_window,
        faults=faults,
        jobs=jobs,
        allowed_hosts=args.allow_host,
    ) as emulator:
        log.info(
            "Cloud Tasks emulator: REST on %s, gRPC on %s (OIDC keys: %s)",
            emulator.url,
            emulator.grpc_target,
            emulator.certs_url,
        )
        if worker is None:
            return _wait(stop)
        queue = f"projects/{worker.project}/locations/{worker.location}/queues/{worker.queue}"
        if emulator.db.get_queue(queue) is None:
            emulator.create_queue(queue)
        worker_url = f"http://127.0.0.1:{worker.worker_port}"
        env = {
            "TASKLEASE_PROJECT": worker.project,
            "TASKLEASE_LOCATION": worker.location,
            "TASKLEASE_QUEUE": worker.queue,
            "TASKLEASE_WORKER_URL": worker_url,
            "TASKLEASE_AUDIENCE": worker_url,
            "TASKLEASE_SERVICE_ACCOUNT": worker.service_account,
            "TASKLEASE_TASKS_ENDPOINT": emulator.url,
            "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": worker.service_account,
            "TASKLEASE_OIDC_CERTS_URL": emulator.certs_url,
        }
        with (
            MinuteSummary(),
            GunicornWorker(
                worker.router,
                store=worker.store,
                auth="oidc",
                workers=worker.workers,
                port=worker.worker_port,
                env=env,
                log_path=None,
                stream_logs=True,
            ),
            _serving_dashboard(worker.store, "127.0.0.1", worker.dashboard_port, env) as board,
        ):
            log.info("worker for %s on %s; queue %s", worker.router, worker_url, queue)
            log.info("dashboard on %s", board)
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
                + f"\nDashboard (runs, stuck, release, replay): {board}\n",
                flush=True,
            )
            return _wait(stop)


def _dashboard(args: argparse.Namespace) -> int:
    """``tasklease dashboard``: serve until interrupted."""
    if not is_loopback_url(f"http://{args.host}/"):
        print(
            f"warning: the dashboard has no login and listens on {args.host}: anyone who "
            "reaches it can release and replay runs. Prefer 127.0.0.1 and an SSH tunnel, or "
            "mount it in the worker behind OIDC (create_app(..., dashboard='/tasklease')).",
            file=sys.stderr,
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    serving = _serving_dashboard(
        args.store, args.host, args.port, None, args.schedules, allowed_hosts=args.allow_host
    )
    with serving as url:
        print(f"tasklease dashboard on {url} (store: {args.store or 'TASKLEASE_STORE'})")
        return _wait(stop)


@contextmanager
def _serving_dashboard(
    store_url: str | None,
    host: str,
    port: int,
    producer_env: dict[str, str] | None,
    schedules: Path | None = None,
    *,
    allowed_hosts: Iterable[str] = (),
) -> Iterator[str]:
    """The dashboard on ``host:port`` in a thread, for as long as the block runs, answering
    loopback ``Host`` names, ``host`` and ``allowed_hosts`` only."""
    from werkzeug.serving import make_server  # noqa: PLC0415

    from tasklease.producer import Producer  # noqa: PLC0415
    from tasklease.worker.dashboard import create_dashboard_app  # noqa: PLC0415
    from tasklease.worker.schedules import default_schedules, load_schedules  # noqa: PLC0415
    from tasklease.worker.stores import store_from_url  # noqa: PLC0415

    app = create_dashboard_app(
        store_from_url(store_url),
        schedules=load_schedules(path) if (path := default_schedules(schedules)) else None,
        producer=(lambda: Producer.from_env(producer_env)) if producer_env else None,
        host=host,
        allowed_hosts=allowed_hosts,
    )
    server = make_server(host, port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="dashboard", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join(timeout=5)


def _wait(stop: threading.Event) -> int:
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
