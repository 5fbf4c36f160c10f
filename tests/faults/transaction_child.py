"""One worker generation of the transactional kill scenario, as a process the test SIGKILLs.

``python -m tests.faults.transaction_child BACKEND TARGET GENERATION TASKS MODE`` claims runs
``t-0`` .. ``t-{TASKS-1}`` in turn on the Spanner database or Firestore collection TARGET, at
a time past every earlier generation's leases (so a run a killed generation held is taken
over), and applies each run's effect: a plain increment, not idempotent. MODE
``transactional``: the effect and the completion in one transaction
(``complete_in_transaction``). MODE ``plain`` (the control): the effect committed on its
own, then ``complete``. MODE ``steps``: the run's :data:`STEPS` steps each one effect (key
``t-N-step-I``) committed with its step record (``record_step_in_transaction``), the steps the
claim found recorded skipped, then ``complete``. A pause after the effect widens the window a
kill can land in.
"""

from __future__ import annotations

import sys
import time
import uuid
from datetime import datetime
from typing import Any

from tasklease.errors import StoreUnavailable
from tasklease.testing.contract_support import EXPIRED, T0, claim_request
from tasklease.worker.core import steps
from tasklease.worker.core.records import Verdict
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores import FirestoreStore, SpannerStore

PROJECT = "tasklease-test"
PAUSE = 0.02  # Seconds between the effect and its completion's commit.
STEPS = 3  # Transactional steps per run in MODE steps.


def moment(generation: int) -> datetime:
    """A time past every lease an earlier generation took (each generation's own included)."""
    return T0 + 2 * EXPIRED * generation


class Effects:
    """The effect, through the store's native transaction or on its own."""

    def __init__(self, backend: str, target: str, store: Any) -> None:
        self.backend, self.target, self.store = backend, target, store

    def apply(self, tx: Any, key: str) -> None:
        if self.backend == "spanner":
            from google.cloud.spanner import param_types  # noqa: PLC0415

            tx.execute_update(
                "INSERT INTO effects (id, key) VALUES (@id, @key)",
                params={"id": str(uuid.uuid4()), "key": key},
                param_types={"id": param_types.STRING, "key": param_types.STRING},
            )
        else:
            from google.cloud import firestore  # noqa: PLC0415

            ref = self.store.client.collection(f"{self.target}_effects").document(key)
            tx.set(ref, {"n": firestore.Increment(1)}, merge=True)

    def apply_alone(self, key: str) -> None:
        if self.backend == "spanner":
            self.store.database.run_in_transaction(lambda tx: self.apply(tx, key))
        else:
            from google.cloud import firestore  # noqa: PLC0415

            ref = self.store.client.collection(f"{self.target}_effects").document(key)
            ref.set({"n": firestore.Increment(1)}, merge=True)


def main(backend: str, target: str, generation: int, tasks: int, mode: str) -> None:
    if backend == "spanner":
        store: Any = SpannerStore(target, call_timeout=5.0)
    else:
        store = FirestoreStore.from_options(collection=target, project=PROJECT)
    effects = Effects(backend, target, store)
    at = moment(generation)
    for index in range(tasks):
        key = f"t-{index}"
        attempt = f"g{generation}-{index}"
        try:
            claim = store.claim(claim_request(key, attempt), at)
            if claim.verdict is not Verdict.CLAIMED:
                continue  # Completed by an earlier generation.
            print(key, flush=True)  # Claimed: the test's cue to pick a moment to kill.

            def work(tx: Any, key: str = key) -> str | None:
                effects.apply(tx, key)
                time.sleep(PAUSE)
                return None

            if mode == "transactional":
                store.complete_in_transaction(key, attempt, work, at)
            elif mode == "steps":
                run_steps(store, effects, key, attempt, claim.record, at)
            else:
                effects.apply_alone(key)
                time.sleep(PAUSE)
                store.complete(key, attempt, None, at)
        except StoreUnavailable as exc:  # A 503: the queue delivers it again later.
            print(f"unavailable {key}: {exc}", file=sys.stderr, flush=True)
    store.close()


def run_steps(store: Any, effects: Effects, key: str, attempt: str, record: Any, at: Any) -> None:
    """The run's steps not recorded yet, each in its own transaction, then its completion;
    stops when a step finds the claim gone."""
    done = steps.steps_of(record)
    for index in range(STEPS):
        name = f"step-{index}"
        if name in done:
            continue  # Recorded by an earlier attempt: replayed, not run.

        def step_work(tx: Any, name: str = name) -> StepRecord:
            effects.apply(tx, f"{key}-{name}")
            time.sleep(PAUSE)
            return StepRecord(name, "null", attempt, at, 4)

        if not store.record_step_in_transaction(key, attempt, step_work, at).held:
            return
    store.complete(key, attempt, None, at)


if __name__ == "__main__":
    backend, target, generation, tasks, mode = sys.argv[1:6]
    main(backend, target, int(generation), int(tasks), mode)
