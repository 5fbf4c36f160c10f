"""``tasklease demo``: the example shop end to end on one machine, with faults injected.

Orders are checked out as a web app would (:mod:`tasklease.demo.orders`): each order row and
its tasks (receipt, charge, posting) commit in one transaction of the shop's own database,
through the outbox, and a relay thread creates the tasks; some checkouts are submitted twice,
some rolled back after their enqueue (they must get no task). A nightly Cloud
Scheduler job fans out one report task per customer, and its run is delivered twice. The
emulator duplicates deliveries and drops responses at random. Each order is also posted to
its customer's account, one posting per account at a time, and two Scheduler jobs (two timers)
fire the exclusive ``reconcile_stock`` at once. Another job starts a Workflows execution
through the worker (a proxy job, against a fake Workflows API in this process), its run
delivered twice. At the end every side effect must have happened exactly once, and no two
exclusive executions overlapped; the exit status says so.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tasklease.demo import has_workflows_client
from tasklease.demo.ledger import Ledger
from tasklease.demo.orders import ABANDON_EVERY, Checkout, OrderTally
from tasklease.demo.transfers import Books
from tasklease.emulator import CloudTasksEmulator, Faults, Job, RetrySettings
from tasklease.emulator.rows import DeliveryRecord
from tasklease.outbox import RelayThread, relay_producer
from tasklease.plumbing.serve import GunicornWorker, free_port
from tasklease.producer import Producer
from tasklease.testing.google_apis import FakeGoogleApis
from tasklease.worker.targets.workflows import carried_key

PROJECT, LOCATION, QUEUE = "demo-project", "us-central1", "default"
SERVICE_ACCOUNT = "tasks@demo-project.iam.gserviceaccount.com"
QUEUE_PATH = f"projects/{PROJECT}/locations/{LOCATION}/queues/{QUEUE}"
EXPORT_PAGES = 5  # The export chain: one run, this many deliveries (ctx.continue_later).
WORKFLOWS_HINT = "pip install 'tasklease[workflows]' to include it"
# A duplicate delivery that finds its run still running is answered 409 and retried: the
# window (0.5 + 1 + 2 + 4 s) outlasts a first run that loads its client libraries (the
# Workflows proxy's) on a loaded machine; 0.2 s doubling to 2 s (3 s in all) did not.
JOB_RETRY = RetrySettings(max_attempts=5, min_backoff=0.5, max_backoff=4, max_doublings=3)


@dataclass(frozen=True)
class DemoSettings:
    orders: int = 200
    customers: int = 25
    duplicate: float = 0.2
    lost_response: float = 0.2
    seed: int | None = None
    workers: int = 2


def run_demo(settings: DemoSettings, out: TextIO | None = None) -> int:
    """Run the demo; return 0 if every side effect happened exactly once, else 1."""
    out = out or sys.stdout
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tasklease-demo-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        worker_url = f"http://127.0.0.1:{port}"
        nightly, export, reconcile = _jobs(worker_url)
        faults = Faults(settings.duplicate, settings.lost_response, settings.seed)
        say(
            out,
            f"starting the Cloud Tasks + Scheduler emulator (faults: {settings.duplicate:.0%} "
            f"duplicate deliveries, {settings.lost_response:.0%} lost responses)",
        )
        workflows = has_workflows_client()
        if workflows:
            say(out, "starting a fake Workflows API (gRPC on 127.0.0.1) for the proxy job")
        else:
            say(out, f"leaving out the Workflows proxy job: {WORKFLOWS_HINT}")
        with (
            FakeGoogleApis(("workflows",) if workflows else ()) as google,
            CloudTasksEmulator(
                data_dir=workdir / "emulator",
                faults=faults,
                jobs=[nightly, export, *reconcile] if workflows else [nightly, *reconcile],
                scheduler_on_schedule=False,
            ) as emulator,
        ):
            emulator.create_queue(
                QUEUE_PATH,
                retryConfig={
                    "maxAttempts": 20,
                    "minBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "maxDoublings": 4,
                },
                rateLimits={"maxDispatchesPerSecond": 500, "maxConcurrentDispatches": 32},
            )
            producer_env = {
                "TASKLEASE_PROJECT": PROJECT,
                "TASKLEASE_LOCATION": LOCATION,
                "TASKLEASE_QUEUE": QUEUE,
                "TASKLEASE_WORKER_URL": worker_url,
                "TASKLEASE_SERVICE_ACCOUNT": SERVICE_ACCOUNT,
                "TASKLEASE_TASKS_ENDPOINT": emulator.url,
                "TASKLEASE_TASKS_GRPC_ENDPOINT": emulator.grpc_target,  # AsyncProducer
            }
            worker_env = {
                **producer_env,
                "TASKLEASE_AUDIENCE": worker_url,
                "TASKLEASE_ALLOWED_SERVICE_ACCOUNTS": SERVICE_ACCOUNT,
                "TASKLEASE_OIDC_CERTS_URL": emulator.certs_url,
                "SHOP_LEDGER": str(workdir / "ledger.db"),
                "SHOP_CUSTOMERS": str(settings.customers),
                "SHOP_RECONCILE_SECONDS": "1",
                "TASKLEASE_WORKFLOWS_EMULATOR_HOST": google.host,
            }
            say(
                out,
                f"starting the worker: gunicorn, {settings.workers} processes, SQLite "
                "store, OIDC verification on",
            )
            worker = GunicornWorker(
                "tasklease.demo.shop:router",
                store=f"sqlite:///{workdir}/runs.db",
                auth="oidc",
                workers=settings.workers,
                port=port,
                env=worker_env,
                log_path=workdir / "worker.log",
            )
            checkout = Checkout(workdir / "shop.db")
            checkout.create()
            with worker, _Progress(emulator, Ledger(workdir / "ledger.db"), out):
                producer = Producer.from_env(producer_env)
                say(
                    out,
                    f"placing {settings.orders} orders (every third one submitted twice, one in "
                    f"{ABANDON_EVERY} more rolled back): each order and its tasks commit in one "
                    "transaction of the shop's database (the outbox); a relay creates the tasks",
                )
                with RelayThread(checkout.url, relay_producer(producer_env), poll=0.05):
                    checkout.place(
                        producer, range(1, settings.orders + 1), abandoned_from=settings.orders + 1
                    )
                    checkout.wait_relayed()
                say(
                    out, f"exporting {EXPORT_PAGES} pages of orders: one run, a chain of deliveries"
                )
                producer.enqueue("export_orders", {"pages": EXPORT_PAGES}, key="export-1")
                say(out, "Cloud Scheduler fires nightly_reports, and delivers that run twice")
                first = emulator.scheduler.run_job("nightly_reports")
                emulator.scheduler.run_job("nightly_reports")
                say(out, "two timers fire the exclusive reconcile_stock at the same moment")
                for job in reconcile:
                    emulator.scheduler.run_job(job.name)
                exported = None
                if workflows:
                    say(out, "Cloud Scheduler fires nightly_export (a Workflows proxy job), twice")
                    exported = emulator.scheduler.run_job("nightly_export")
                    emulator.scheduler.run_job("nightly_export")
                emulator.scheduler.join(timeout=60)
                emulator.join(QUEUE_PATH, timeout=120)
                run_ok = first.result() and (exported is None or exported.result())
            report = _Report.build(settings, checkout, emulator, Ledger(workdir / "ledger.db"))
            report.books = Books.read(workdir / "runs.db")  # The store's own database.
            if google.workflows is not None:
                report.count_workflow_executions(google.workflows.executions)
        report.print(out, time.monotonic() - started, run_ok)
        return 0 if report.exactly_once and run_ok else 1


def _jobs(worker_url: str) -> tuple[Job, Job, list[Job]]:
    """The demo's Cloud Scheduler jobs: nightly reports, the Workflows export, and two timers
    of the exclusive reconcile job."""
    export = Job(
        name="nightly_export",
        schedule="0 4 * * *",
        url=f"{worker_url}/jobs/nightly_export",
        service_account=SERVICE_ACCOUNT,
        retry=JOB_RETRY,
    )
    nightly = Job(
        name="nightly_reports",
        schedule="0 3 * * *",
        url=f"{worker_url}/jobs/nightly_reports",
        service_account=SERVICE_ACCOUNT,
        retry=JOB_RETRY,
    )
    # Two timers firing one exclusive job: the overlap ShedLock exists for.
    reconcile = [
        Job(
            name=name,
            schedule="0 4 * * *",
            url=f"{worker_url}/jobs/reconcile_stock",
            service_account=SERVICE_ACCOUNT,
            retry=RetrySettings(max_attempts=5, min_backoff=0.2, max_backoff=2, max_doublings=3),
        )
        for name in ("reconcile_stock", "reconcile_stock_backup")
    ]
    return nightly, export, reconcile


@dataclass
class _Report:
    tasks_enqueued: int
    enqueue_duplicates: int
    deliveries: int
    injected_duplicates: int
    injected_lost: int
    absorbed: int
    executions: dict[str, Counter[str]]
    missing: dict[str, int]
    skipped_overlaps: int
    keys_busy: int
    workflow_executions: int = 0
    workflow_keys_carried: int = 0
    workflows_counted: bool = False  # False: the proxy job was left out (no Workflows client).
    books: Books | None = None  # The transactional charges, read from the store's database.
    orders: int = 0
    checkout: OrderTally | None = None  # The outbox: committed vs rolled-back orders.
    # Cloud Scheduler's attempts, printed when Scheduler gave up on a run (why it did).
    scheduler_attempts: list[DeliveryRecord] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        settings: DemoSettings,
        checkout: Checkout,
        emulator: CloudTasksEmulator,
        ledger: Ledger,
    ) -> _Report:
        deliveries = emulator.deliveries()
        task_names = {d.name for d in deliveries if d.kind == "task"}
        counts = ledger.counts()
        executions: dict[str, Counter[str]] = {}
        for key, count in counts.items():
            kind, _, item = key.partition(":")
            executions.setdefault(kind, Counter())[item] = count
        expected = {
            "receipt": settings.orders,
            "report": settings.customers,
            "nightly_run": 1,
            "posting": settings.orders,
            "stock_reconcile": 1,
            "export_page": EXPORT_PAGES,
        }
        missing = {
            kind: number - len(executions.get(kind, {})) for kind, number in expected.items()
        }
        receipts_run = {int(key.removeprefix("order-")) for key in executions.get("receipt", {})}
        tally = checkout.tally(task_names, receipts_run)
        return cls(
            tasks_enqueued=len(task_names),
            enqueue_duplicates=tally.duplicates_absorbed,
            deliveries=len(deliveries),
            injected_duplicates=sum(d.fault == "duplicate" for d in deliveries),
            injected_lost=sum(d.fault == "lost_response" for d in deliveries),
            absorbed=sum(d.outcome in ("duplicate", "in_progress") for d in deliveries),
            executions=executions,
            missing=missing,
            skipped_overlaps=len({d.name for d in deliveries if d.outcome == "skipped_overlap"}),
            keys_busy=sum(d.outcome == "key_busy" for d in deliveries),
            orders=settings.orders,
            checkout=tally,
            scheduler_attempts=[d for d in deliveries if d.kind == "scheduler"],
        )

    def count_workflow_executions(self, executions: list[Any]) -> None:
        """What the fake Workflows API started: one execution, its argument carrying a key."""
        self.workflows_counted = True
        self.workflow_executions = len(executions)
        self.workflow_keys_carried = sum(
            carried_key(execution.argument) is not None for execution in executions
        )

    @property
    def overlaps(self) -> int:
        """Executions that found another of the same exclusive work still running."""
        return sum(self.executions.get("overlap", Counter()).values())

    @property
    def exactly_once(self) -> bool:
        counts = [n for kind in self.executions.values() for n in kind.values()]
        workflows_once = not self.workflows_counted or (
            self.workflow_executions == self.workflow_keys_carried == 1
        )
        return (
            not any(self.missing.values())
            and all(n == 1 for n in counts)
            and (self.books is None or self.books.adds_up(self.orders))
            and (self.checkout is None or self.checkout.adds_up(self.orders))
            and not self.overlaps
            and workflows_once
        )

    def print(self, out: TextIO, seconds: float, run_ok: bool) -> None:
        rows = []
        if self.checkout is not None:
            verdict = "adds up" if self.checkout.adds_up(self.orders) else "DOES NOT add up"
            rows.append((f"checkout through the outbox {verdict}", self.checkout.describe()))
        rows += [
            ("tasks enqueued (distinct task names)", str(self.tasks_enqueued)),
            ("enqueue duplicates absorbed by task names", str(self.enqueue_duplicates)),
            ("deliveries (HTTP requests to the worker)", str(self.deliveries)),
            ("  injected: duplicate deliveries", str(self.injected_duplicates)),
            ("  injected: lost responses (then retried)", str(self.injected_lost)),
            ("duplicate deliveries absorbed by the worker", str(self.absorbed)),
        ]
        labels = {
            "receipt": "receipts sent, per order",
            "report": "reports sent, per customer",
            "nightly_run": "nightly fan-outs, per scheduled run",
            "posting": "ledger postings, per order",
            "stock_reconcile": "stock reconciliations (two timers fired)",
            "export_page": f"export pages (1 run, {EXPORT_PAGES} continued deliveries)",
        }
        for kind, label in labels.items():
            counts = self.executions.get(kind, Counter())
            spread = f"{min(counts.values())}..{max(counts.values())}" if counts else "-"
            missing = f", {self.missing[kind]} never ran" if self.missing[kind] else ""
            rows.append((f"executions: {label}", f"{len(counts)} x {spread}{missing}"))
        if self.books is not None:
            moves = self.books.moves_per_order
            spread = f"{min(moves.values())}..{max(moves.values())}" if moves else "-"
            rows.append(
                ("charges moved in the run's transaction, per order", f"{len(moves)} x {spread}")
            )
            verdict = "add up" if self.books.adds_up(self.orders) else "DO NOT add up"
            rows.append((f"balances {verdict}", self.books.describe()))
        rows.append(
            (
                "overlaps prevented (exclusive job, concurrency keys)",
                f"{self.skipped_overlaps} run skipped, {self.keys_busy} postings deferred "
                f"(key_busy); {self.overlaps} overlapped",
            )
        )
        rows.append(
            (
                "workflow executions started (proxy job, 1 run)",
                f"{self.workflow_executions}, {self.workflow_keys_carried} carrying the run key"
                if self.workflows_counted
                else f"left out ({WORKFLOWS_HINT})",
            )
        )
        width = max(len(label) for label, _ in rows)
        print("", file=out)
        for label, value in rows:
            print(f"  {label:<{width}}  {value}", file=out)
        if not run_ok:  # Why Cloud Scheduler gave up on a run.
            print("  Cloud Scheduler's attempts (status, outcome, injected fault):", file=out)
            for d in self.scheduler_attempts:
                answer = f"{d.status} {d.outcome or '-'} {d.fault or ''} {d.error or ''}"
                print(f"    {d.name} #{d.attempt}: {answer}", file=out)
        verdict = (
            "every side effect happened exactly once"
            if self.exactly_once and run_ok
            else ("FAILED: some side effect happened twice or never")
        )
        print(f"\n{verdict} ({seconds:.1f} s)", file=out)


class _Progress:
    """Prints a progress line about once a second while the demo runs."""

    def __init__(self, emulator: CloudTasksEmulator, ledger: Ledger, out: TextIO) -> None:
        self._emulator, self._ledger, self._out = emulator, ledger, out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                side_effects = sum(self._ledger.counts().values())
            except Exception:
                side_effects = 0
            say(
                self._out,
                f"  ... {len(self._emulator.deliveries())} deliveries, "
                f"{self._emulator.db.count_tasks()} tasks queued, "
                f"{side_effects} side effects",
            )


def say(out: TextIO, message: str) -> None:
    print(message, file=out, flush=True)
