"""FirestoreStore vs the seed's sample algorithm: executions per second and RPCs per
execution, through Google's Firestore emulator (``--emulator npm``: the npm stand-in), in one
run.

The baseline is Google's sample handler from the seed (two ``@firestore.transactional``
functions: claim_run reads then sets, finish_run reads then updates), reproduced below with
the same fields. Both do the same work: N first executions (claim, then complete) and N
duplicate deliveries of completed runs. RPCs are counted at the client's transport.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from google.cloud import firestore

from tasklease.worker.core import decisions
from tasklease.worker.core.records import Verdict
from tasklease.worker.stores import FirestoreStore
from tests.support.firestore import RpcCounter, run_gcloud_emulator, run_npm_emulator
from tests.support.helpers import claim_request

LEASE = timedelta(minutes=5)
RETENTION = timedelta(days=1)
PROJECT = "tasklease-bench"


@firestore.transactional
def claim_run(
    transaction: firestore.Transaction,
    run_ref: firestore.DocumentReference,
    attempt_id: str,
    now: datetime,
) -> str:
    """The seed's claim: read in a transaction, then set."""
    snapshot = run_ref.get(transaction=transaction)
    if snapshot.exists:
        run = snapshot.to_dict() or {}
        if run["status"] == "completed":
            return "completed"
        if run["lease_expires"] > now:
            return "in_progress"
    transaction.set(
        run_ref,
        {
            "status": "in_progress",
            "attempt_id": attempt_id,
            "lease_expires": now + LEASE,
            "expire_at": now + RETENTION,
        },
    )
    return "claimed"


@firestore.transactional
def finish_run(
    transaction: firestore.Transaction,
    run_ref: firestore.DocumentReference,
    attempt_id: str,
    succeeded: bool,
) -> None:
    """The seed's finish: read in a transaction, then update (or delete)."""
    snapshot = run_ref.get(transaction=transaction)
    if not snapshot.exists or (snapshot.to_dict() or {}).get("attempt_id") != attempt_id:
        return
    if succeeded:
        transaction.update(run_ref, {"status": "completed"})
    else:
        transaction.delete(run_ref)


def seed_sample(client: firestore.Client, collection: str) -> Callable[[str, bool], bool]:
    def execute(run_id: str, retry: bool) -> bool:  # The sample reads the same way either way.
        ref = client.collection(collection).document(run_id)
        attempt_id = uuid.uuid4().hex
        status = claim_run(client.transaction(), ref, attempt_id, datetime.now(UTC))
        if status != "claimed":
            return False
        finish_run(client.transaction(), ref, attempt_id, succeeded=True)
        return True

    return execute


def tasklease_store(store: FirestoreStore) -> Callable[[str, bool], bool]:
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
    parser.add_argument(
        "--warmup",
        type=int,
        default=100,
        help="untimed runs of both first, so neither pays for the emulator's JIT warm-up",
    )
    parser.add_argument(
        "--emulator",
        choices=["gcloud", "npm"],
        default="gcloud",
        help="Google's emulator (default), or @firestore-emulator/server, which enforces "
        "neither preconditions nor transaction isolation",
    )
    args = parser.parse_args()
    emulator = run_gcloud_emulator(PROJECT) if args.emulator == "gcloud" else run_npm_emulator()
    with emulator as host:
        os.environ["FIRESTORE_EMULATOR_HOST"] = host
        client = firestore.Client(project=PROJECT)
        baseline_counter = RpcCounter(client)
        store = FirestoreStore(firestore.Client(project=PROJECT), "tasklease_runs")
        store_counter = RpcCounter(store.client)
        for runs in (args.warmup, args.runs):  # The last round is the one reported.
            baseline = measure(seed_sample(client, "seed_runs"), baseline_counter, runs)
            ours = measure(tasklease_store(store), store_counter, runs)
    print(
        f"firestore: {args.runs} first executions, then {args.runs} duplicates, "
        f"through the {args.emulator} Firestore emulator"
    )
    print(f"  {'':26} {'first execution':>26} {'duplicate':>26}")
    for label, row in [
        ("seed sample (2 transactions)", baseline),
        ("tasklease FirestoreStore", ours),
    ]:
        print(
            f"  {label:28} {row['first_per_s']:7.0f}/s {row['first_rpcs']:4.1f} RPCs "
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
