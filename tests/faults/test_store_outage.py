"""Scenario 5: the store fails during claims, renewals and finishes.

Another process holds SQLite's write lock (``BEGIN EXCLUSIVE``) for several seconds, longer
than the worker's busy timeout (0.5 s here); or Google's Firestore emulator, a private
PostgreSQL cluster (postmaster and backends) or a private Spanner emulator is frozen (SIGSTOP)
for longer than the store's call timeout, then resumed; or the PostgreSQL cluster crashes
(``pg_ctl stop -m immediate``) and starts again on the same port and data directory, after
several seconds down (tests/faults/outages.py). Meanwhile running handlers
cannot renew or record how they ended, and new deliveries cannot claim: they must answer 503
without running anything. Once the store is back, retries finish every run, each effect once.

SQLite made read-only by file permissions is not tested: these tests run as root, whom
permissions do not stop, and the worker's open connections would keep writing anyway.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker.core.records import RunStatus
from tests.faults.downstream import ALREADY_APPLIED, APPLIED, Downstream
from tests.faults.harness import (
    FULL,
    Backend,
    Deliverer,
    FaultServer,
    Tally,
    overlaps,
    scale,
    tally,
    unclaimed,
)
from tests.faults.outages import KINDS, Outage, store_outage

pytestmark = pytest.mark.faults


# The reduced suite runs the SQLite, Firestore and frozen-Postgres outages; `make faults` runs
# them all (Postgres restarted and Spanner frozen each start a private server).
_REDUCED = ("sqlite locked", "firestore frozen", "postgres frozen")
_FULL_ONLY = pytest.mark.skipif(not FULL, reason="in the full suite only (make faults)")


def _kinds(kinds: list[str], reduced: tuple[str, ...]) -> list[Any]:
    return [k if k in reduced else pytest.param(k, marks=_FULL_ONLY) for k in kinds]


@pytest.fixture(params=_kinds(list(KINDS), _REDUCED))
def outage(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Backend, Outage]]:
    with store_outage(request.param, tmp_path, monkeypatch) as backend_and_outage:
        yield backend_and_outage


@pytest.fixture(
    params=_kinds([kind for kind in KINDS if kind != "firestore frozen"], ("sqlite locked",))
)
def lapsing(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Backend, Outage]]:
    """The outages of the lease-lapse scenario (on Firestore: not run, for time)."""
    with store_outage(request.param, tmp_path, monkeypatch) as backend_and_outage:
        yield backend_and_outage


def test_a_store_outage_runs_no_handler_without_a_claim_and_loses_nothing(
    tmp_path: Path, outage: tuple[Backend, Outage], report: Callable[[str, Tally], None]
) -> None:
    backend, failure = outage
    count = scale(8, 40)
    # At the outage: handlers that finish just after it began, handlers that need renewals
    # throughout it, and then deliveries of new runs that need a claim. Running handlers wait
    # for wall-clock times, so they are where they should be whatever the machine's load.
    finishing = [f"outage-f-{n:04d}" for n in range(count)]
    renewing = [f"outage-r-{n:04d}" for n in range(count)]
    arriving = [f"outage-a-{n:04d}" for n in range(count)]
    keys = finishing + renewing + arriving
    deliverer = Deliverer("outage")
    downstream = Downstream(tmp_path / "downstream.db")
    server = FaultServer(tmp_path, store=backend.url, workers=2, threads=len(keys), env=backend.env)
    with server:
        outage_at = time.time() + scale(6, 12)
        payloads = {
            **{key: {"until": outage_at + 0.5} for key in finishing},
            **{key: {"until": outage_at + 4, "steps": 40, "check": True} for key in renewing},
            **{key: {"sleep": 0.2} for key in arriving},
        }
        first = threading.Thread(
            target=deliverer.deliver_all,
            # Claims contend for the store's lock too: one may time out before the outage.
            args=([(server.url, key, payloads[key]) for key in finishing + renewing], 2 * count),
            kwargs={"retry_unavailable": True},
        )
        first.start()
        while len(downstream.executions()) < 2 * count:
            assert time.time() < outage_at - 0.2, "handlers did not all start in time"
            time.sleep(0.02)
        time.sleep(max(0.0, outage_at - time.time()))
        began = failure.begin()
        time.sleep(1.0)
        # New runs, and duplicates of the running ones.
        deliverer.deliver_all([(server.url, key, payloads[key]) for key in keys], len(keys))
        ended = failure.end()
        first.join()
        deliverer.until_done(keys, server.url, payloads.__getitem__, timeout=180)
        log = server.log()

    executions = downstream.executions()
    records = backend.records()
    outcomes = Counter(a.outcome for a in deliverer.answers)
    writes = downstream.writes()
    started_during = [e for e in executions if began + 0.5 < e.started < ended]
    # Handlers that returned, and so tried to record their end, while the store was out: their
    # finish either waited the outage out or answered 503 (unrecorded) and ran again later.
    finished_during = [
        e for e in executions if e.key in finishing and e.ended and began < e.ended < ended
    ]
    counts = tally(
        keys,
        deliverer.answers,
        downstream,
        records,
        claims_refused_503=outcomes["unavailable"],
        finishes_during_outage=len(finished_during),
        finishes_unrecorded_503=outcomes["unrecorded"],
        renewals_failed=log.count("lease renewal of run"),
        started_during_outage=len(started_during),
        effects_applied=writes[APPLIED],
        retried_after_effect=writes[ALREADY_APPLIED],
    )
    report(f"store_outage[{backend.name}]", counts)
    assert counts.lost == 0
    assert outcomes["unavailable"] > 0 and finished_during  # The outage hit claims, finishes...
    assert log.count("lease renewal of run") > 0  # ...and renewals.
    assert started_during == []  # No handler ran without a claim...
    assert unclaimed(executions, records) == []  # ...and every entry had a claim of its own.
    assert overlaps(executions) == []
    assert writes[APPLIED] == len(keys)
    assert {r.status for r in records.values()} == {RunStatus.COMPLETED}


def test_a_handler_whose_lease_lapses_in_an_outage_stops_before_a_retry_takes_over(
    tmp_path: Path, lapsing: tuple[Backend, Outage], report: Callable[[str, Tally], None]
) -> None:
    # The outage outlasts the 2 s lease of handlers that run until a time after it, checking
    # their lease every 0.25 s or so; retries keep arriving, as the queue's would, and take the
    # runs over once the store is back. The lapsed attempts must have stopped by then.
    backend, failure = lapsing
    keys = [f"lapse-{n:04d}" for n in range(scale(6, 20))]
    deliverer = Deliverer("lapse")
    downstream = Downstream(tmp_path / "downstream.db")
    server = FaultServer(
        tmp_path,
        store=backend.url,
        workers=2,
        threads=len(keys) * 2,
        env=backend.env,
    )
    with server:
        slow = {"until": time.time() + failure.seconds + scale(6, 10), "steps": 48, "check": True}
        first = threading.Thread(
            target=deliverer.deliver_all,
            args=([(server.url, key, slow) for key in keys], len(keys)),
            kwargs={"retry_unavailable": True},
        )
        first.start()
        deadline = time.monotonic() + 60
        while len(downstream.executions()) < len(keys):
            assert first.is_alive() and time.monotonic() < deadline, "handlers did not start"
            time.sleep(0.05)
        began = failure.begin()
        while time.time() < began + failure.seconds:
            deliverer.deliver_all([(server.url, key, slow) for key in keys], len(keys))
            time.sleep(0.2)
        failure.end()
        deliverer.until_done(keys, server.url, lambda _: slow, timeout=180)
        first.join()

    executions = downstream.executions()
    records = backend.records()
    outcomes = Counter(a.outcome for a in deliverer.answers)
    found = overlaps(executions)
    counts = tally(
        keys,
        deliverer.answers,
        downstream,
        records,
        claims_refused_503=outcomes["unavailable"],
        lost_claim_409=outcomes["lost_claim"],
        overlapping_executions=len(found),
        lease_checks_passed_after_expiry=sum(e.past_lease for e in executions),
        late_writes_refused=downstream.writes()["refused"],
    )
    report(f"store_outage[{backend.name}] lease lapse", counts)
    assert counts.lost == 0
    assert unclaimed(executions, records) == []
    # A lease check must fail once the lease has lapsed unrenewed: from then on a retry may
    # take the run over, and two handlers would run at once.
    assert [e for e in executions if e.past_lease] == []
    assert found == [], f"{len(found)} runs had two handlers running at once"
