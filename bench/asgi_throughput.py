"""Throughput of tasklease.worker.asgi as a deployment runs it, against a bare Starlette route.

The ASGI twin of bench/worker_throughput.py, with its load generator (wrk, else a slower
Python stand-in) and its rounds. Every server runs under one uvicorn configuration, the deploy
kit's (``python -m tasklease.worker.asgi_serve``: 2 worker processes, access log off). The
headline rows are deployable configurations: OIDC verification on (tokens signed by a local
key, whose certificate a local server publishes cacheable for an hour, as Google's is; each
request carries a token) and a durable store, SqliteStore in a file (synchronous=FULL) and
PostgresStore on a private cluster on the same cores (fsync on, the store URL's defaults),
each with the ``async def`` handler (the like-for-like twin of the bare route) and the sync
one, first executions (a new task name per request) and duplicates (one repeated name marked
as a retry). Their anchor is the bare Starlette route doing the same work behind the same
token check (google-auth's ``verify_token``, keys cached), so the ratio is tasklease's cost.

Reference rows, never a headline: the bare route without authentication, and with
``--stores memory`` or ``--auth none`` tasklease on MemoryStore (one process's memory: not a
store two workers can share) or with authentication off (anyone could forge a delivery);
``(ref)`` marks them, and their ratio is to the bare route with the same authentication.

Servers are measured one after another within each round, each fully stopped before the next
starts; quote the ratios of one round of one run. ``cpu us/req`` is the server's worker
processes' CPU (user + system) per request, ``store us/req`` the Postgres cluster's;
``cpu ratio`` is the anchor's CPU per request over the row's, the store's included.

    python -m bench.asgi_throughput [--rounds 2] [--seconds 8] [--stores sqlite,postgres]
        [--handlers async,sync] [--auth oidc]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench.common import BENCH_DIR, ROOT, free_port, oidc_certs, wait_for_port
from bench.postgres_floor import cluster_cpu_seconds, private_postgres
from bench.worker_throughput import Load, Server, post, run_python, run_wrk
from tasklease.emulator.oidc import TokenIssuer
from tests.support.postgres import Cluster, NoPostgres, bindir

SERVICE_ACCOUNT = "tasks@bench.iam.gserviceaccount.com"
# The worker's configured audience (TASKLEASE_AUDIENCE): a root URL, as a deployment's is.
AUDIENCE = "https://worker.bench.invalid"
STORES = ("sqlite", "postgres", "memory")
DURABLE = ("sqlite", "postgres")


@dataclass(frozen=True)
class Row:
    """What one configuration sustained: the load, and the store server's CPU per request."""

    load: Load
    auth: str
    reference: bool
    store_cpu_us: float = 0.0


class UvicornServer(Server):
    """One uvicorn server of bench.asgi_apps, started and fully stopped."""

    def __init__(self, app: str, env: dict[str, str], log: Path, token: str | None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "tasklease.worker.asgi_serve", f"bench.asgi_apps:{app}",
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "2",
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as output:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **env}, stdout=output, stderr=output
            )
        wait_for_port(self.port)
        for index in range(20):  # Every worker imported the app, fetched the keys and answers.
            status = post(self.port, f"warm-{uuid.uuid4().hex}-{index}", retry=0, token=token)
            if status != 200:
                self.stop()
                raise RuntimeError(f"{app} answered a warm-up delivery {status}: see {log}")
        time.sleep(1.0)


class Run:
    """One run's shared pieces: the load generator, the token issuer, the Postgres cluster."""

    def __init__(self, seconds: int, log: Path, cleanup: ExitStack, postgres: bool) -> None:
        self.seconds = seconds
        self.log = log
        self.drive: Callable[..., Load] = run_wrk if shutil.which("wrk") else run_python
        self.issuer = TokenIssuer()
        self.certs_url = cleanup.enter_context(oidc_certs(self.issuer))
        self.cluster: Cluster | None = None
        if postgres:
            try:
                bindir()
            except NoPostgres as exc:
                raise SystemExit(
                    f"--stores postgres: {exc}; install PostgreSQL (apt-get install "
                    "postgresql) or pass --stores sqlite"
                ) from None
            self.cluster = cleanup.enter_context(private_postgres())

    def auth_env(self, auth: str) -> dict[str, str]:
        """What a deployment sets for ``auth``; bare_oidc reads the same variables."""
        if auth == "none":
            return {"BENCH_AUTH": "none"}
        return {
            "BENCH_AUTH": "oidc",
            "TASKLEASE_AUDIENCE": AUDIENCE,
            "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": SERVICE_ACCOUNT,
            "TASKLEASE_OIDC_CERTS_URL": self.certs_url,
        }

    def token(self, auth: str) -> str | None:
        """A fresh ID token (valid an hour) for a server with ``auth``."""
        return self.issuer.mint(SERVICE_ACCOUNT, AUDIENCE) if auth == "oidc" else None

    @contextmanager
    def server(self, app: str, auth: str, env: dict[str, str]) -> Iterator[Measure]:
        """A server of ``app`` with ``auth``, and how to drive it."""
        token = self.token(auth)
        server = UvicornServer(app, {**env, **self.auth_env(auth)}, self.log, token)
        try:
            yield Measure(self, server, token)
        finally:
            server.stop()


@dataclass(frozen=True)
class Measure:
    """Drives one started server with its token."""

    run: Run
    server: UvicornServer
    token: str | None

    def __call__(self, script: str, auth: str, reference: bool) -> Row:
        cluster = self.run.cluster
        used = cluster_cpu_seconds(cluster) if cluster else 0.0
        drive = partial(self.run.drive, token=self.token)
        load = self.server.measure(drive, script, self.run.seconds)
        store = (cluster_cpu_seconds(cluster) - used) if cluster else 0.0
        return Row(load, auth, reference, store / max(load.requests, 1) * 1e6)

    def complete(self, task: str) -> None:
        """Run ``task`` to completion in both workers' stores (memory: one per process)."""
        for _ in range(4):
            post(self.server.port, task, retry=0, token=self.token)


def bare_name(auth: str) -> str:
    return "bare oidc" if auth == "oidc" else "bare no auth"


def measure_round(
    run: Run, stores: list[str], handlers: list[str], auths: list[str]
) -> dict[str, Row]:
    results: dict[str, Row] = {}
    for auth in ("none", "oidc"):  # Both anchors every round; no auth is a reference.
        with run.server("bare_oidc" if auth == "oidc" else "bare", auth, {}) as measure:
            results[bare_name(auth)] = measure("first.lua", auth, auth == "none")
    for store in stores:
        for auth in auths:
            for handler in handlers:
                with tempfile.TemporaryDirectory() as folder:
                    env = {"BENCH_STORE": store, "BENCH_HANDLER": handler}
                    env["BENCH_DB"] = str(Path(folder) / "runs.db")
                    if store == "postgres":  # A schema of its own per server: tables empty.
                        assert run.cluster is not None
                        env["BENCH_DB"] = run.cluster.url(schema=f"bench_{uuid.uuid4().hex[:8]}")
                    reference = store not in DURABLE or auth == "none"
                    name = f"{auth} {store} {handler}" + (" (ref)" if reference else "")
                    with run.server("tasklease", auth, env) as measure:
                        results[f"{name} first"] = measure("first.lua", auth, reference)
                        measure.complete("same-task")
                        results[f"{name} dup"] = measure("duplicate.lua", auth, reference)
    return results


def print_round(round_: int, results: dict[str, Row]) -> None:
    print(f"round {round_}:")
    print(
        f"  {'server':<34}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'cpu us/req':>11}"
        f"{'store us/req':>13}{'ratio':>7}{'cpu ratio':>10}"
    )
    for name, row in results.items():
        anchor = results[bare_name(row.auth)]
        load = row.load
        note = f"  ({load.failures} non-2xx)" if load.failures else ""
        cpu_ratio = anchor.load.cpu_us / max(load.cpu_us + row.store_cpu_us, 1e-9)
        print(
            f"  {name:<34}{load.rate:>8.0f}{load.p50_ms:>8.2f}{load.p99_ms:>8.2f}"
            f"{load.cpu_us:>11.0f}{row.store_cpu_us:>13.0f}"
            f"{load.rate / anchor.load.rate:>7.2f}{cpu_ratio:>10.2f}{note}"
        )


def choices(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    """``option``'s comma-separated ``text``, each one of ``allowed``; else exit saying so."""
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in allowed]
    if unknown or not chosen:
        raise SystemExit(f"{option} {text!r}: a comma-separated list of {', '.join(allowed)}")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument(
        "--stores", default="sqlite,postgres", help="of sqlite, postgres, memory (a reference)"
    )
    parser.add_argument("--handlers", default="async,sync", help="of async, sync")
    parser.add_argument("--auth", default="oidc", help="of oidc, none (a reference)")
    args = parser.parse_args()
    stores = choices(args.stores, STORES, "--stores")
    handlers = choices(args.handlers, ("async", "sync"), "--handlers")
    auths = choices(args.auth, ("oidc", "none"), "--auth")
    if shutil.which("wrk") is None:
        print(
            "warning: wrk not found (apt-get install wrk, or make bench); using the Python "
            "load generator, which is slower than the servers: ratios understate differences",
            file=sys.stderr,
        )
    log = BENCH_DIR / "asgi_throughput.log"
    print(
        "uvicorn (tasklease.worker.asgi_serve) 2 workers; wrk 2 threads, 16 connections; "
        "trivial handler; ratios to the bare Starlette route with the same auth"
    )
    with ExitStack() as cleanup:
        run = Run(args.seconds, log, cleanup, postgres="postgres" in stores)
        for round_ in range(1, args.rounds + 1):
            print_round(round_, measure_round(run, stores, handlers, auths))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
