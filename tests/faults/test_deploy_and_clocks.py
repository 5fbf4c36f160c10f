"""Scenarios 6 and 7: two servers on one queue and one store.

6. Deploy overlap: the old revision and the new one both receive deliveries of the same
   tasks, until the old one is shut down (SIGTERM) mid-run, as a Cloud Run rollout does.
7. Clock skew: one server's clock runs behind, the other's ahead, by half the documented
   bound each (``MAX_CLOCK_SKEW`` apart in all); the one ahead keeps receiving retries of
   runs the other holds, under the shortest lease, and must never take one over.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tasklease.worker.core import constants
from tasklease.worker.core.records import RunStatus
from tests.faults.downstream import Downstream
from tests.faults.harness import (
    Backend,
    Deliverer,
    FaultServer,
    Tally,
    overlaps,
    scale,
    tally,
    unclaimed,
)

pytestmark = pytest.mark.faults


def _payload(key: str) -> dict[str, Any]:
    rng = random.Random(key)
    return {"sleep": round(rng.uniform(0.2, 1.0), 3), "steps": 2, "check": True}


def test_old_and_new_revisions_serving_one_queue_run_each_task_once(
    tmp_path: Path, backend_full: Backend, report: Callable[[str, Tally], None]
) -> None:
    backend = backend_full
    keys = [f"deploy-{n:04d}" for n in range(scale(60, 300))]
    store, env = backend.url, backend.env
    deliverer = Deliverer("deploy")
    with ExitStack() as servers:
        old = servers.enter_context(
            FaultServer(tmp_path, store=store, name="old", revision="r1", env=env)
        )
        new = servers.enter_context(
            FaultServer(tmp_path, store=store, name="new", revision="r2", env=env)
        )
        # Every task goes to both revisions at once; the old one is stopped midway.
        sending = threading.Thread(
            target=deliverer.deliver_all,
            args=([(url, key, _payload(key)) for key in keys for url in (old.url, new.url)], 24),
        )
        sending.start()
        downstream = Downstream(tmp_path / "downstream.db")
        deadline = time.monotonic() + 60
        while len(downstream.executions()) < len(keys) // 3:
            assert time.monotonic() < deadline, "handlers did not start"
            time.sleep(0.05)
        old.stop()  # SIGTERM: gunicorn stops accepting and lets running requests finish.
        sending.join()
        deliverer.until_done(keys, new.url, _payload, timeout=180)

    executions = downstream.executions()
    records = backend.records()
    by_revision = Counter(e.revision for e in executions)
    counts = tally(
        keys,
        deliverer.answers,
        downstream,
        records,
        executed_old=by_revision["r1"],
        executed_new=by_revision["r2"],
        refused_by_stopped_server=sum(a.status is None for a in deliverer.answers),
    )
    report(f"deploy_overlap[{backend.name}]", counts)
    assert counts.lost == 0
    assert by_revision["r1"] > 0 and by_revision["r2"] > 0
    assert [e for e in executions if e.ended is None] == []  # The old one drained.
    assert counts.executed == len(keys)
    assert overlaps(executions) == []
    assert unclaimed(executions, records) == []
    assert {r.status for r in records.values()} == {RunStatus.COMPLETED}


def test_clock_skew_within_the_documented_bound_never_lets_a_lease_be_taken_over(
    tmp_path: Path, backend_full: Backend, report: Callable[[str, Tally], None]
) -> None:
    backend = backend_full
    skew = constants.MAX_CLOCK_SKEW.total_seconds() / 2
    keys = [f"skew-{n:04d}" for n in range(scale(8, 20))]
    held = {"sleep": 4.0, "steps": 16, "check": True}
    store, env = backend.url, backend.env
    deliverer = Deliverer("skew", handler="brief")  # The shortest lease: 1 s.
    downstream = Downstream(tmp_path / "downstream.db")
    with ExitStack() as servers:
        behind = servers.enter_context(
            FaultServer(
                tmp_path, store=store, name="behind", clock_skew=-skew, threads=len(keys), env=env
            )
        )
        ahead = servers.enter_context(
            FaultServer(
                tmp_path, store=store, name="ahead", clock_skew=skew, threads=len(keys), env=env
            )
        )
        # Half the runs are held by the server behind, half by the one ahead; the other
        # server keeps receiving their retries while they run.
        holder = {key: (behind.url, ahead.url)[n % 2] for n, key in enumerate(keys)}
        other = {key: (ahead.url, behind.url)[n % 2] for n, key in enumerate(keys)}
        holding = threading.Thread(
            target=deliverer.deliver_all,
            args=([(holder[key], key, held) for key in keys], len(keys)),
        )
        holding.start()
        deadline = time.monotonic() + 60
        while len(downstream.executions()) < len(keys):
            assert time.monotonic() < deadline, "handlers did not start"
            time.sleep(0.05)
        retries = 0
        while holding.is_alive():
            deliverer.deliver_all([(other[key], key, held) for key in keys], len(keys))
            retries += len(keys)
            time.sleep(0.25)
        deliverer.until_done(keys, lambda: ahead.url, lambda _: held, timeout=120)

    executions = downstream.executions()
    records = backend.records()
    outcomes = Counter(a.outcome for a in deliverer.answers)
    counts = tally(
        keys,
        deliverer.answers,
        downstream,
        records,
        skew_seconds=f"+-{skew:g}",
        retries_during_runs=retries,
        in_progress_409=outcomes["in_progress"],
        lost_claim_409=outcomes["lost_claim"],
        takeovers=len(executions) - len(keys),
    )
    report(f"clock_skew[{backend.name}]", counts)
    assert counts.lost == 0
    assert outcomes["in_progress"] > 0  # Retries reached the other server and were refused.
    # No retry took a run over from a live holder. (On a starved machine a holder may miss
    # its renewals and stop itself, answering lost_claim; a retry may then take over, after
    # it stopped: that is no overlap.)
    assert overlaps(executions) == []
    assert sum(e.past_lease for e in executions) == 0
    assert unclaimed(executions, records) == []
