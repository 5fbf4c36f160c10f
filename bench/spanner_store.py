"""SpannerStore: executions per second and RPCs per execution through Google's Spanner
emulator, against a baseline of two read-write transactions per execution, in one run.

The baseline is the seed's sample algorithm (claim: read then write in a transaction; finish:
read then update in another) written for Spanner with the same client. Both do the same work:
N first executions (claim, then complete) and N duplicate deliveries of completed runs,
marked as retries. RPCs are counted at the client's transport (tests/support/spanner.py).
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from google.cloud import spanner

from tasklease.worker.core import decisions
from tasklease.worker.core.records import Verdict
from tasklease.worker.stores import SpannerStore
from tests.support.helpers import claim_request
from tests.support.spanner import RpcCounter, create_database, run_emulator

LEASE = timedelta(minutes=5)
RETENTION = timedelta(days=1)
PROJECT = "tasklease-bench"
SEED_DDL = (
    "CREATE TABLE seed_runs (run_id STRING(MAX) NOT NULL, status STRING(32) NOT NULL, "
    "attempt_id STRING(MAX) NOT NULL, lease_expires TIMESTAMP NOT NULL, "
    "expire_at TIMESTAMP NOT NULL) PRIMARY KEY (run_id)"
)
_SEED_COLUMNS = ("run_id", "status", "attempt_id", "lease_expires", "expire_at")


def seed_sample(database: Any) -> Callable[[str, bool], bool]:
    """Two read-write transactions per execution, as Google's sample does on Firestore."""

    def claim(transaction: Any, run_id: str, attempt_id: str, now: datetime) -> str:
        keys = spanner.KeySet(keys=[[run_id]])  # type: ignore[no-untyped-call]
        rows = list(transaction.read("seed_runs", ("status", "lease_expires"), keys))
        if rows:
            status, lease_expires = rows[0]
            if status == "completed":
                return "completed"
            if lease_expires > now:
                return "in_progress"
        row = [run_id, "in_progress", attempt_id, now + LEASE, now + RETENTION]
        transaction.insert_or_update("seed_runs", _SEED_COLUMNS, [row])
        return "claimed"

    def finish(transaction: Any, run_id: str, attempt_id: str) -> None:
        keys = spanner.KeySet(keys=[[run_id]])  # type: ignore[no-untyped-call]
        rows = list(transaction.read("seed_runs", ("attempt_id",), keys))
        if rows and rows[0][0] == attempt_id:
            transaction.update("seed_runs", ("run_id", "status"), [[run_id, "completed"]])

    def execute(run_id: str, retry: bool) -> bool:  # The sample reads the same way either way.
        attempt_id = uuid.uuid4().hex
        status = database.run_in_transaction(claim, run_id, attempt_id, datetime.now(UTC))
        if status != "claimed":
            return False
        database.run_in_transaction(finish, run_id, attempt_id)
        return True

    return execute


def tasklease_store(store: SpannerStore) -> Callable[[str, bool], bool]:
    def execute(run_id: str, retry: bool) -> bool:
        attempt_id = uuid.uuid4().hex
        now = datetime.now(UTC)
        if retry:  # As the executor does for a delivery whose headers say it is a retry.
            seen = store.get(run_id)
            if seen is not None and decisions.decide(seen, now) is not Verdict.CLAIMED:
                return False
        claim = store.claim(claim_request(run_id, attempt_id), now)
        if claim.verdict is not Verdict.CLAIMED:
            return False
        store.complete(run_id, attempt_id, None, now)
        return True

    return execute


def measure(
    execute: Callable[[str, bool], bool], counter: RpcCounter, runs: int
) -> dict[str, float]:
    ids = [uuid.uuid4().hex for _ in range(runs)]
    counter.take()
    started = time.perf_counter()
    executed = sum(execute(run_id, False) for run_id in ids)
    first_seconds = time.perf_counter() - started
    first_rpcs = len(counter.take())
    started = time.perf_counter()
    repeated = sum(execute(run_id, True) for run_id in ids)  # Redelivered: marked retries.
    duplicate_seconds = time.perf_counter() - started
    duplicate_rpcs = len(counter.take())
    if executed != runs or repeated != 0:
        raise RuntimeError(f"executed {executed} of {runs}, then {repeated} duplicates ran")
    return {
        "first_per_s": runs / first_seconds,
        "first_rpcs": first_rpcs / runs,
        "dup_per_s": runs / duplicate_seconds,
        "dup_rpcs": duplicate_rpcs / runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100, help="untimed runs of both first")
    args = parser.parse_args()
    with run_emulator(PROJECT) as emulator:
        os.environ["SPANNER_EMULATOR_HOST"] = emulator.host
        path = create_database(emulator.host, PROJECT)
        store = SpannerStore(path)
        store.create_schema()
        store.get("warm-up")  # The session, before counting.
        store_counter = RpcCounter(store.database)
        seed_database = (
            spanner.Client(project=PROJECT)
            .instance(path.split("/")[3])  # type: ignore[no-untyped-call]
            .database(path.split("/")[5])
        )
        seed_database.update_ddl([SEED_DDL]).result(60)
        seed_counter = RpcCounter(seed_database)
        for runs in (args.warmup, args.runs):  # The last round is the one reported.
            baseline = measure(seed_sample(seed_database), seed_counter, runs)
            ours = measure(tasklease_store(store), store_counter, runs)
        store.close()
    print(
        f"spanner: {args.runs} first executions, then {args.runs} duplicates, "
        "through Google's Spanner emulator"
    )
    print(f"  {'':30} {'first execution':>22} {'duplicate':>22}")
    for label, row in [
        ("seed algorithm (2 transactions)", baseline),
        ("tasklease SpannerStore", ours),
    ]:
        print(
            f"  {label:32} {row['first_per_s']:7.0f}/s {row['first_rpcs']:4.1f} RPCs "
            f"{row['dup_per_s']:10.0f}/s {row['dup_rpcs']:4.1f} RPCs"
        )
    print(
        f"  ratio tasklease / seed: {ours['first_per_s'] / baseline['first_per_s']:4.2f}x "
        f"executions/s, {baseline['first_rpcs'] / ours['first_rpcs']:4.2f}x fewer RPCs per first "
        f"execution; {ours['dup_per_s'] / baseline['dup_per_s']:4.2f}x duplicates/s, "
        f"{baseline['dup_rpcs'] / ours['dup_rpcs']:4.2f}x fewer RPCs per duplicate"
    )


if __name__ == "__main__":
    main()
