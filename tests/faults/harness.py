"""Servers, deliveries and checks shared by the fault scenarios.

Deliveries go straight to gunicorn over loopback, carrying Cloud Tasks headers, from a thread
pool; scenarios where the queue's retry behaviour matters use the local emulator instead.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3

from tasklease.plumbing.serve import GunicornWorker
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.stores import SqliteStore, store_from_url
from tests.faults.app import ENV_CLOCK_SKEW, ENV_DOWNSTREAM, ENV_REVISION
from tests.faults.downstream import Downstream, Execution
from tests.support.helpers import task_headers

FULL = os.environ.get("TASKLEASE_FAULTS", "").lower() == "full"

# Answers after which the queue stops retrying: the run is done, one way or another.
TERMINAL = {"processed", "duplicate", "failed"}


def scale(reduced: int, full: int) -> int:
    """``full`` under ``TASKLEASE_FAULTS=full`` (``make faults``), else ``reduced``."""
    return full if FULL else reduced


def scenario(name: str, server: str, backend: Backend) -> str:
    """A counts line's name: ``storm[sqlite]`` under gunicorn, ``storm[sqlite uvicorn]``."""
    return f"{name}[{backend.name}{'' if server == 'gunicorn' else ' ' + server}]"


class FaultServer(GunicornWorker):
    """A gunicorn (or ``server="uvicorn"``) server of ``tests.faults.app:app`` whose processes
    the test may kill."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        store: str,
        name: str = "server",
        workers: int = 2,
        threads: int = 8,
        revision: str = "r1",
        clock_skew: float = 0.0,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        server: str = "gunicorn",
    ) -> None:
        self.log_path = tmp_path / f"{name}.log"
        super().__init__(
            "tests.faults.app:app",
            store=store,
            workers=workers,
            threads=threads,
            port=port,
            server=server,
            env={
                ENV_DOWNSTREAM: str(tmp_path / "downstream.db"),
                ENV_REVISION: revision,
                ENV_CLOCK_SKEW: str(clock_skew),
                "TASKLEASE_LOG_FORMAT": "text",
                **(env or {}),
            },
            log_path=self.log_path,
        )

    @property
    def arbiter_pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def worker_pids(self) -> list[int]:
        """The worker processes now alive (children of gunicorn's arbiter or uvicorn's
        supervisor, but not the resource tracker multiprocessing's spawn starts beside them)."""
        return [pid for pid in children_of(self.arbiter_pid) if not _resource_tracker(pid)]

    def wait_for_workers(self, count: int, timeout: float = 60.0) -> None:
        """Wait until ``count`` workers answer (the arbiter respawns killed ones)."""
        deadline = time.monotonic() + timeout
        while len(self.worker_pids()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"gunicorn has {len(self.worker_pids())} of {count} workers")
            time.sleep(0.1)

    def kill_all(self) -> list[int]:
        """SIGKILL every worker and the arbiter, as a crashed host would; return the pids."""
        pids = self.worker_pids()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        assert self._process is not None
        self._process.kill()
        self._process.wait()
        return pids

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _resource_tracker(pid: int) -> bool:
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def children_of(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] not in ("Z", "X"):
            pids.append(int(entry))
    return pids


@dataclass(frozen=True)
class Answer:
    """One delivery's answer (``status`` None: no answer, e.g. the process was killed)."""

    key: str
    status: int | None
    outcome: str | None
    run_id: str | None
    retry_after: float | None
    target: str
    sent: float
    body: dict[str, Any] = field(default_factory=dict, compare=False)


class Deliverer:
    """Posts deliveries of tasks (queue ``queue``, task name = key) over a pooled connection."""

    def __init__(
        self, queue: str, handler: str = "work", timeout: float = 120.0, keep_alive: bool = False
    ) -> None:
        self.queue = queue
        # A new connection per delivery (as from Cloud Tasks' many front ends) lets every
        # worker process accept some; kept-alive ones stick to whichever process took them.
        self.keep_alive = keep_alive
        self.handler = handler
        self.timeout = timeout
        self._pool = urllib3.PoolManager(num_pools=8, maxsize=64, retries=False)
        self._retries: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.answers: list[Answer] = []

    def deliver(
        self, url: str, key: str, payload: Mapping[str, Any], retry_unavailable: bool = False
    ) -> Answer:
        """One delivery; with ``retry_unavailable``, repeated while the store answers 503
        (as the queue would retry it, sooner)."""
        for _ in range(100):
            answer = self._deliver_once(url, key, payload)
            if not (retry_unavailable and answer.outcome == "unavailable"):
                break
            time.sleep(0.05)
        return answer

    def _deliver_once(self, url: str, key: str, payload: Mapping[str, Any]) -> Answer:
        with self._lock:
            retry = self._retries[key]
            self._retries[key] += 1
        sent = time.time()
        headers = task_headers(queue=self.queue, task=key, retry=retry)
        headers["Content-Type"] = "application/json"
        if not self.keep_alive:
            headers["Connection"] = "close"
        try:
            response = self._pool.request(
                "POST",
                f"{url}/tasks/{self.handler}",
                body=json.dumps({"key": key, **payload}).encode(),
                headers=headers,
                timeout=urllib3.Timeout(connect=10, read=self.timeout),
                redirect=False,
            )
        except urllib3.exceptions.HTTPError:
            answer = Answer(key, None, None, None, None, url, sent)
        else:
            try:
                body = json.loads(response.data)
            except ValueError:
                body = {}
            retry_after = response.headers.get("Retry-After")
            answer = Answer(
                key,
                response.status,
                response.headers.get("X-Tasklease-Outcome"),
                response.headers.get("X-Tasklease-Run-Id"),
                float(retry_after) if retry_after else None,
                url,
                sent,
                body if isinstance(body, dict) else {},
            )
        with self._lock:
            self.answers.append(answer)
        return answer

    def deliver_all(
        self,
        deliveries: Iterable[tuple[str, str, Mapping[str, Any]]],
        concurrency: int = 32,
        retry_unavailable: bool = False,
    ) -> list[Answer]:
        """Send (url, key, payload) deliveries concurrently, in order of submission."""

        def deliver(delivery: tuple[str, str, Mapping[str, Any]]) -> Answer:
            url, key, payload = delivery
            return self.deliver(url, key, payload, retry_unavailable)

        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(deliver, deliveries))

    def until_done(
        self,
        keys: Iterable[str],
        url: str | Callable[[], str],
        payload: Callable[[str], Mapping[str, Any]],
        *,
        timeout: float = 120.0,
        concurrency: int = 16,
    ) -> None:
        """Redeliver each key, as the queue would retry it, until a terminal answer."""
        pending = set(keys) - self.done()
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} tasks not done after {timeout} s")
            target = url() if callable(url) else url
            answers = self.deliver_all(
                [(target, key, payload(key)) for key in sorted(pending)], concurrency
            )
            pending = {a.key for a in answers if a.outcome not in TERMINAL}
            if pending:
                waits = [a.retry_after or 0.5 for a in answers if a.key in pending]
                time.sleep(min(2.0, max(0.2, min(waits))))

    def done(self) -> set[str]:
        with self._lock:
            return {a.key for a in self.answers if a.outcome in TERMINAL}

    def outcomes(self) -> Counter[str | None]:
        with self._lock:
            return Counter(a.outcome for a in self.answers)


@dataclass
class Tally:
    """The counts each scenario prints and asserts."""

    delivered: int
    executed: int
    duplicates_absorbed: int
    lost: int
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self, name: str) -> str:
        fields = {
            "delivered": self.delivered,
            "executed": self.executed,
            "duplicates_absorbed": self.duplicates_absorbed,
            "lost": self.lost,
            **self.extra,
        }
        return f"{name}: " + " ".join(f"{k}={v}" for k, v in fields.items())


def tally(
    keys: Iterable[str],
    answers: list[Answer],
    downstream: Downstream,
    records: Mapping[str, RunRecord],
    **extra: Any,
) -> Tally:
    """Count what happened. ``lost``: keys without their effect or a completed run record."""
    keys = set(keys)
    outcomes = Counter(a.outcome for a in answers)
    effects = downstream.effects()
    executions = downstream.executions()
    key_of = {e.run_id: e.key for e in executions}
    completed = {key_of.get(r.run_id) for r in records.values() if r.status is RunStatus.COMPLETED}
    lost = {k for k in keys if effects[k] != 1 or k not in completed}
    return Tally(
        delivered=len(answers),
        executed=len(executions),
        duplicates_absorbed=outcomes["duplicate"] + outcomes["in_progress"],
        lost=len(lost),
        extra=extra,
    )


@dataclass(frozen=True)
class Backend:
    """The lease store a scenario runs on: its URL and the environment the servers need."""

    name: str
    url: str
    env: dict[str, str] = field(default_factory=dict)

    def records(self) -> dict[str, RunRecord]:
        """Every run record, read directly from the store after the scenario."""
        store = store_from_url(self.url)
        try:
            return {r.run_id: r for r in store.list_runs(limit=1_000_000)}
        finally:
            store.close()


def sqlite_records(path: Path) -> dict[str, RunRecord]:
    store = SqliteStore(path)
    try:
        return {r.run_id: r for r in store.list_runs(limit=1_000_000)}
    finally:
        store.close()


def overlaps(
    executions: Iterable[Execution], killed_at: Mapping[int, float] | None = None
) -> list[tuple[Execution, Execution]]:
    """Pairs of executions of one run that were active at once (:meth:`Execution.active_until`:
    a handler stopped by LeaseLost counts until its last passed lease check; one that never
    ended, until its process was killed (``killed_at``: pid -> time), or for ever)."""
    killed_at = killed_at or {}
    by_run: dict[str, list[Execution]] = {}
    for execution in executions:
        by_run.setdefault(execution.run_id, []).append(execution)
    found = []
    for runs in by_run.values():
        runs.sort(key=lambda e: e.started)
        latest: Execution | None = None  # The earlier execution active the longest.
        latest_end = float("-inf")
        for execution in runs:
            if latest is not None and execution.started < latest_end:
                found.append((latest, execution))
            end = execution.active_until(killed_at.get(execution.pid))
            if end > latest_end:
                latest, latest_end = execution, end
    return found


def unclaimed(executions: Iterable[Execution], records: Mapping[str, RunRecord]) -> list[Execution]:
    """Executions no claim accounts for.

    Every claim issues a new fencing token for its run, and only a claim does. So each handler
    entry must carry a token of its own (never shared with another entry of the run), no
    greater than the run's current token.
    """
    seen: set[tuple[str, int]] = set()
    bad = []
    for execution in executions:
        record = records.get(execution.run_id)
        token = (execution.run_id, execution.fencing_token)
        if record is None or execution.fencing_token > record.fencing_token or token in seen:
            bad.append(execution)
        seen.add(token)
    return bad
