"""The store outages of scenario 5 (tests/faults/test_store_outage.py), each on a store of its
own: SQLite's write lock held by another process, Google's Firestore emulator frozen, a private
PostgreSQL cluster frozen or crashed and restarted, a private Spanner emulator frozen. Nothing
here touches the session's shared cluster or emulators, which other tests use meanwhile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tasklease.worker.stores import store_from_url
from tests.faults.harness import Backend
from tests.faults.private_firestore import PROJECT, PrivateFirestore, private_firestore
from tests.support import postgres as postgres_support
from tests.support import spanner as spanner_support

HOLD_LOCK = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
print(time.time(), flush=True)
time.sleep(float(sys.argv[2]))
released = time.time()
connection.execute("ROLLBACK")
print(released, flush=True)
"""
BUSY_TIMEOUT = 0.5
OUTAGE = 6.0  # Longer than a lease (2 s) and than a finish's retries (4 x 0.5 s + pauses).
FIRESTORE_CALL_TIMEOUT = 1.5
FIRESTORE_OUTAGE = 10.0  # Longer than a finish's retries (4 x 1.5 s + pauses).
# The Postgres store cuts a call the server does not answer one second past the server's own
# statement_timeout: 2 s here, so a finish's 4 tries and their pauses take about 8.75 s.
PG_STATEMENT_TIMEOUT = 1.0
PG_FROZEN = 10.0
SPANNER_CALL_TIMEOUT = 1.5
SPANNER_FROZEN = 10.0  # Longer than a finish's retries (4 x 1.5 s + pauses).
KINDS = ("sqlite locked", "firestore frozen", "postgres frozen", "postgres restarted",
         "spanner frozen")  # fmt: skip


class Outage:
    """Makes the store unavailable: ``begin()`` returns when it is, ``end()`` when it is back
    (both return the wall-clock time it happened), ``seconds`` after it began."""

    seconds: float

    def begin(self) -> float:
        raise NotImplementedError

    def end(self) -> float:
        raise NotImplementedError


class SqliteLocked(Outage):
    """Another process holds SQLite's write lock for ``seconds``."""

    def __init__(self, path: Path, seconds: float) -> None:
        self.path, self.seconds = path, seconds
        self._holder: subprocess.Popen[str] | None = None

    def begin(self) -> float:
        self._holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(self.path), str(self.seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._holder.stdout is not None
        return float(self._holder.stdout.readline())

    def end(self) -> float:
        assert self._holder is not None and self._holder.stdout is not None
        released = float(self._holder.stdout.readline())
        self._holder.wait()
        self._holder.stdout.close()
        return released


class _Frozen(Outage):
    """Processes stopped (SIGSTOP) for ``seconds``: every call hangs until the store's call
    timeout, as on a partitioned network. Then they resume (SIGCONT), with their data."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._began = 0.0

    def freeze(self) -> None:
        raise NotImplementedError

    def thaw(self) -> None:
        raise NotImplementedError

    def begin(self) -> float:
        self.freeze()
        self._began = time.time()
        return self._began

    def end(self) -> float:
        time.sleep(max(0.0, self._began + self.seconds - time.time()))
        self.thaw()
        return time.time()


class FirestoreFrozen(_Frozen):
    """The Firestore emulator's process group (gcloud, bash, java) stopped."""

    def __init__(self, emulator: PrivateFirestore, seconds: float) -> None:
        super().__init__(seconds)
        self.emulator = emulator

    def freeze(self) -> None:
        self.emulator.freeze()

    def thaw(self) -> None:
        self.emulator.thaw()


class PostgresFrozen(_Frozen):
    """The private cluster's postmaster and every process it forked (backends, checkpointer,
    WAL writer...) stopped: connections stay open and answer nothing."""

    def __init__(self, cluster: postgres_support.Cluster, seconds: float) -> None:
        super().__init__(seconds)
        self.cluster = cluster
        self.stopped: list[int] = []

    def freeze(self) -> None:
        """The postmaster first, so it forks no backend the list would miss; then wait until
        the kernel shows every one stopped (kill returns before the signal is delivered)."""
        postmaster, *_ = self.cluster.processes()
        os.kill(postmaster, signal.SIGSTOP)
        self.stopped = self.cluster.processes()
        for pid in self.stopped[1:]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not all(_state(pid) in ("T", None) for pid in self.stopped):
            assert time.monotonic() < deadline, "the cluster's processes did not stop"
            time.sleep(0.01)

    def thaw(self) -> None:
        for pid in self.stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.stopped = []


def _state(pid: int) -> str | None:
    """A process's state letter (proc(5), ``/proc/PID/stat``), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class PostgresRestarted(Outage):
    """The private cluster crashed (``pg_ctl stop -m immediate``: no checkpoint, every
    connection cut), down for ``seconds``, then started again on the same port and data
    directory: it recovers from its WAL, and the store's pooled connections are all dead."""

    def __init__(self, cluster: postgres_support.Cluster, seconds: float) -> None:
        self.cluster, self.seconds = cluster, seconds
        self._began = 0.0

    def begin(self) -> float:
        self.cluster.stop("immediate")
        self._began = time.time()
        return self._began

    def end(self) -> float:
        time.sleep(max(0.0, self._began + self.seconds - time.time()))
        self.cluster.start()
        return time.time()


class SpannerFrozen(_Frozen):
    """The private Spanner emulator's process group (gcloud, gateway, emulator) stopped."""

    def __init__(self, emulator: spanner_support.Emulator, seconds: float) -> None:
        super().__init__(seconds)
        self.emulator = emulator

    def freeze(self) -> None:
        self.emulator.freeze()

    def thaw(self) -> None:
        self.emulator.thaw()


@contextmanager
def store_outage(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Backend, Outage]]:
    """A store of its own for the scenario, and the outage ``kind`` of it."""
    if kind == "sqlite locked":
        env = {"TASKLEASE_FAULTS_BUSY_TIMEOUT": str(BUSY_TIMEOUT)}
        yield (
            Backend(kind, f"sqlite:///{tmp_path}/runs.db", env),
            SqliteLocked(tmp_path / "runs.db", OUTAGE),
        )
    elif kind == "firestore frozen":
        with private_firestore() as firestore:
            env = {"FIRESTORE_EMULATOR_HOST": firestore.host, "GOOGLE_CLOUD_PROJECT": PROJECT}
            url = f"firestore://?collection=outage&call_timeout={FIRESTORE_CALL_TIMEOUT}"
            _warm(monkeypatch, env, "firestore://?collection=outage&call_timeout=60")
            yield Backend(kind, url, env), FirestoreFrozen(firestore, FIRESTORE_OUTAGE)
    elif kind in ("postgres frozen", "postgres restarted"):
        with postgres_support.running_cluster() as cluster:
            schema = postgres_support.fresh_schema()
            url = cluster.url(
                schema=schema, statement_timeout=str(PG_STATEMENT_TIMEOUT), pool_timeout="1"
            )
            _warm(monkeypatch, {}, cluster.url(schema=schema))  # Its tables, before the outage.
            outage: Outage = (
                PostgresFrozen(cluster, PG_FROZEN)
                if kind == "postgres frozen"
                else PostgresRestarted(cluster, OUTAGE)
            )
            try:
                yield Backend(kind, url), outage
            finally:
                if isinstance(outage, PostgresFrozen):
                    outage.thaw()  # A frozen server would not stop.
    elif kind == "spanner frozen":
        try:
            with spanner_support.run_emulator() as spanner:
                database = spanner_support.create_database(spanner.host)
                env = {"SPANNER_EMULATOR_HOST": spanner.host}
                url = f"spanner://{database}?call_timeout={SPANNER_CALL_TIMEOUT}"
                _warm(monkeypatch, env, f"spanner://{database}?call_timeout=60")
                yield Backend(kind, url, env), SpannerFrozen(spanner, SPANNER_FROZEN)
        except spanner_support.EmulatorDidNotStart as exc:
            message = f"no Spanner emulator: {exc}"
            if spanner_support.IN_CI:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
    else:
        raise ValueError(kind)


def _warm(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str) -> None:
    """Set ``env`` for the test's own reads of the records, and make the store's tables (a
    fresh emulator's or cluster's first calls are slow: not the outage)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = store_from_url(url)
    try:
        store.get("warm-up")
    finally:
        store.close()
