"""The durable-waits part of the store contract: a suspension, a signal and a wait's
resolution are each one atomic change of the run's record, on every store.

Part of :class:`~tasklease.testing.store_contract.StoreContract`; the rules themselves are
:mod:`tasklease.worker.core.waits`, which the base store's methods apply.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from tasklease.testing.contract_support import T0, claim_request
from tasklease.worker.core import steps, waits
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.core.waits import Signalled, Wait
from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["WaitsContract"]

WAIT = Wait("approval", 0, T0, T0 + timedelta(hours=1), queue="default")


class WaitsContract:
    """Semantics every store's waits must have."""

    def _waiting(self, store: LeaseStore, run_id: str = "run-1") -> None:
        assert store.claim(claim_request(run_id), T0).verdict is Verdict.CLAIMED
        step = StepRecord("asked", '"yes"', "attempt-1", T0, 5)
        assert store.record_step(run_id, "attempt-1", step) is not None
        assert store.suspend(run_id, "attempt-1", WAIT, '{"order":7}', T0) is not None

    def test_a_suspended_run_keeps_its_steps_payload_and_wait_exactly(
        self, store: LeaseStore
    ) -> None:
        self._waiting(store)
        record = store.get("run-1")
        assert record is not None and record.status is RunStatus.WAITING
        assert list(steps.steps_of(record)) == ["asked"]
        assert record.payload == '{"order":7}' and waits.waits_of(record).wait == WAIT
        # A retried suspension whose first try landed finds its own record.
        again = store.suspend("run-1", "attempt-1", WAIT, '{"order":7}', T0)
        assert again is not None and again.waits_json == record.waits_json
        assert store.suspend("run-1", "attempt-2", WAIT, None, T0) is None  # Not its claim.

    def test_a_signal_is_kept_once_and_resumes_the_run_it_waits_for(
        self, store: LeaseStore
    ) -> None:
        assert store.signal_run("none", "approval", "1", T0).outcome is Signalled.MISSING
        self._waiting(store)
        first = store.signal_run("run-1", "approval", '{"ok":true}', T0)
        assert first.outcome is Signalled.RESUMES and first.resume == WAIT
        second = store.signal_run("run-1", "approval", '{"ok":false}', T0)
        assert second.outcome is Signalled.DUPLICATE and second.resume == WAIT
        other = store.signal_run("run-1", "later", '"x"', T0)
        assert other.outcome is Signalled.KEPT and other.resume is None
        record = store.get("run-1")
        assert record is not None
        kept = waits.waits_of(record).signals
        assert {name: s.payload_json for name, s in kept.items()} == {
            "approval": '{"ok":true}',
            "later": '"x"',
        }
        claim = store.claim(claim_request("run-1", "attempt-2"), T0 + timedelta(seconds=1))
        assert claim.verdict is Verdict.CLAIMED and claim.record.payload == '{"order":7}'

    def test_a_wait_resolves_in_one_fenced_write_that_a_retry_finds(
        self, store: LeaseStore
    ) -> None:
        self._waiting(store)
        store.signal_run("run-1", "approval", '"yes"', T0)
        store.claim(claim_request("run-1", "attempt-2"), T0 + timedelta(seconds=1))
        refused = store.resolve_wait("run-1", "attempt-1", "approval", 0, T0)
        assert not refused.held  # Not the attempt holding the run.
        resolution = store.resolve_wait("run-1", "attempt-2", "approval", 0, T0)
        assert resolution.held and resolution.step is not None
        assert resolution.step.result == {"signal": "yes"}
        retried = store.resolve_wait("run-1", "attempt-2", "approval", 0, T0)
        assert retried.step == resolution.step
        record = store.get("run-1")
        assert record is not None
        state = waits.waits_of(record)
        assert state.signals == {} and state.delivered == {"approval": "signal"}
        assert list(steps.steps_of(record)) == ["asked", "wait:approval"]
        late = store.signal_run("run-1", "approval", '"again"', T0)
        assert late.outcome is Signalled.DUPLICATE and late.resume is None

    def test_a_timeout_resolves_only_once_due(self, store: LeaseStore) -> None:
        self._waiting(store)
        early = T0 + timedelta(minutes=59)
        assert store.claim(claim_request("run-1", "attempt-2"), early).verdict is Verdict.WAITING
        due = T0 + timedelta(hours=1)
        assert store.claim(claim_request("run-1", "attempt-2"), due).verdict is Verdict.CLAIMED
        resolution = store.resolve_wait("run-1", "attempt-2", "approval", 0, due)
        assert resolution.step is not None and "timed_out" in resolution.step.result
        late = store.signal_run("run-1", "approval", "1", due)
        assert late.outcome is Signalled.TIMED_OUT

    def test_a_signal_racing_the_suspension_is_never_lost(self, store: LeaseStore) -> None:
        for n in range(10):
            run_id = f"race-{n}"
            assert store.claim(claim_request(run_id), T0).verdict is Verdict.CLAIMED
            seen: dict[str, object] = {}
            start = threading.Barrier(2)

            def suspend(
                run: str = run_id, box: dict[str, object] = seen, go: threading.Barrier = start
            ) -> None:
                go.wait()
                box["suspended"] = store.suspend(run, "attempt-1", WAIT, None, T0)

            def signal(
                run: str = run_id, box: dict[str, object] = seen, go: threading.Barrier = start
            ) -> None:
                go.wait()
                box["signal"] = store.signal_run(run, "approval", '"go"', T0)

            threads = [threading.Thread(target=suspend), threading.Thread(target=signal)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            suspended = seen["suspended"]
            decision = seen["signal"]
            assert suspended is not None and isinstance(decision, waits.SignalDecision)
            # One of the two knows the resume is due: the signal saw the run waiting, or the
            # suspension's own write found the signal.
            assert decision.outcome is Signalled.RESUMES or waits.signal_due(suspended)  # type: ignore[arg-type]
            record = store.get(run_id)
            assert record is not None and "approval" in waits.waits_of(record).signals

    def test_a_cancelled_waiting_run_takes_no_signal(self, store: LeaseStore) -> None:
        self._waiting(store)
        cancelled = store.cancel_run("run-1", "ops@example.com", T0)
        assert cancelled.record is not None and cancelled.record.status is RunStatus.CANCELLED
        assert cancelled.record.cancelled_by == "ops@example.com"
        assert store.signal_run("run-1", "approval", "1", T0).outcome is Signalled.ENDED
        early = store.claim(claim_request("run-1", "attempt-2"), T0 + timedelta(hours=2))
        assert early.verdict is Verdict.CANCELLED
