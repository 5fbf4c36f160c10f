"""The operators' part of the store contract: listing, look-up, release, replay links, for
a store that implements :class:`~tasklease.worker.stores.OperatorQueries`."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from tasklease.testing.contract_support import EXPIRED, LEASE, T0, claim_request
from tasklease.worker.core.decisions import ReleaseOutcome, replay_pending
from tasklease.worker.core.queries import RunFilter
from tasklease.worker.core.records import RunRecord, RunStatus, Verdict
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import LeaseStore

# The moment the listing tests look from: one run in every state.
NOW = T0 + timedelta(hours=1)


def seed_every_state(store: LeaseStore, t0: datetime = T0) -> dict[str, RunRecord]:
    """One run per state, claimed a minute apart from ``t0`` on, but ``live``, claimed just
    before ``t0 + 1 hour`` (NOW), when ``stuck``'s lease has long expired, and ``waiting``
    and ``cancelled``, claimed between ``stuck`` and ``completed``."""
    names = ["stuck", "completed", "failed", "released", "skipped", "manual", "live"]
    claimed_at = {name: t0 + timedelta(minutes=index) for index, name in enumerate(names)}
    claimed_at.update(waiting=t0 + timedelta(seconds=20), cancelled=t0 + timedelta(seconds=40))
    claimed_at["live"] = t0 + (NOW - T0) - timedelta(seconds=10)
    for name, at in sorted(claimed_at.items(), key=lambda item: item[1]):
        index = names.index(name) if name in names else 0
        if name in ("manual", "skipped"):
            identity = {"job_name": "nightly", "schedule_time": f"2026-10-16T12:0{index}:00Z"}
            identity["trigger"] = "manual" if name == "manual" else "scheduled"
            request = claim_request(name, kind="scheduler", handler="nightly", identity=identity)
        else:
            request = claim_request(name, identity={"queue": "default", "task_name": f"t-{name}"})
        assert store.claim(request, at).verdict is Verdict.CLAIMED
        if name == "completed":
            assert store.complete(name, "attempt-1", '{"sent":true}', at)
        elif name == "failed":
            assert store.fail(name, "attempt-1", "PermanentFailure: bad", at, '{"order":7}')
        elif name == "released":
            assert store.release(name, "attempt-1", "RuntimeError: flaky", at)
        elif name == "skipped":
            assert store.skip(name, "attempt-1", "stuck", "job:nightly", at)
        elif name == "manual":
            assert store.complete(name, "attempt-1", None, at)
        elif name == "waiting":
            assert store.suspend(name, "attempt-1", None, None, at) is not None
        elif name == "cancelled":
            assert store.cancel_run(name, "operator@example.com", at).record is not None
            assert store.end_cancelled(name, "attempt-1", at)
    return {name: store.get(name) for name in claimed_at}  # type: ignore[misc]


def ids(runs: list[RunRecord]) -> list[str]:
    return [run.run_id for run in runs]


class OperationsContract:
    """Semantics every store must have for ``tasklease runs`` and the dashboard."""

    def test_records_in_every_state_are_listed_by_status_newest_first(
        self, store: OperatorQueries
    ) -> None:
        runs = seed_every_state(store)
        listed = store.query_runs(limit=100).runs
        assert ids(listed) == [
            "live", "manual", "skipped", "released", "failed", "completed", "cancelled",
            "waiting", "stuck",
        ]  # fmt: skip
        assert listed == [runs[name] for name in ids(listed)]
        for status in RunStatus:
            page = store.query_runs(RunFilter(status=status))
            assert all(run.status is status for run in page.runs)
            assert page.runs, f"no {status.value} run listed"
        assert ids(store.query_runs(RunFilter(status=RunStatus.SKIPPED)).runs) == ["skipped"]
        assert ids(store.query_runs(RunFilter(status=RunStatus.IN_PROGRESS)).runs) == [
            "live",
            "stuck",
        ]

    def test_filters_by_handler_kind_age_manual_and_stuck(self, store: OperatorQueries) -> None:
        seed_every_state(store)

        def listed(**filters: object) -> list[str]:
            return ids(store.query_runs(RunFilter(**filters)).runs)  # type: ignore[arg-type]

        assert listed(handler="nightly") == ["manual", "skipped"]
        assert listed(kind="scheduler") == ["manual", "skipped"]
        assert listed(kind="task", status=RunStatus.FAILED) == ["failed"]
        assert listed(older_than=T0 + timedelta(minutes=2)) == [
            "completed",
            "cancelled",
            "waiting",
            "stuck",
        ]
        assert listed(newer_than=T0 + timedelta(minutes=5)) == ["live", "manual"]
        assert listed(manual=True) == ["manual"]
        assert "manual" not in listed(manual=False)
        assert listed(stuck_at=NOW) == ["stuck"]
        assert listed(stuck_at=NOW, handler="nightly") == []

    def test_paging_with_cursors_lists_every_run_once_in_order(
        self, store: OperatorQueries
    ) -> None:
        for index in range(7):
            # Two runs share each claim time: the run id breaks the tie.
            at = T0 + timedelta(seconds=index // 2)
            store.claim(claim_request(f"run-{index}"), at)
        seen: list[str] = []
        cursor = None
        for _ in range(10):
            page = store.query_runs(limit=3, cursor=cursor)
            seen += ids(page.runs)
            cursor = page.cursor
            if cursor is None:
                break
        everything = ids(store.query_runs(limit=100).runs)
        assert seen == everything
        assert sorted(seen) == [f"run-{index}" for index in range(7)]
        with pytest.raises(ValueError, match="cursor"):
            store.query_runs(cursor="not-a-cursor")

    def test_a_filtered_page_reads_past_runs_that_do_not_match(
        self, store: OperatorQueries
    ) -> None:
        for index in range(12):
            manual = index % 4 == 0
            identity = {"job_name": "j", "trigger": "manual" if manual else "scheduled"}
            store.claim(
                claim_request(f"r{index:02}", kind="scheduler", identity=identity),
                T0 + timedelta(seconds=index),
            )
        page = store.query_runs(RunFilter(manual=True), limit=2)
        assert ids(page.runs) == ["r08", "r04"]
        rest = store.query_runs(RunFilter(manual=True), limit=2, cursor=page.cursor)
        assert ids(rest.runs) == ["r00"]

    def test_runs_are_found_by_task_name_or_by_job_and_schedule_time(
        self, store: OperatorQueries
    ) -> None:
        runs = seed_every_state(store)
        assert store.find_runs(task_name="t-failed") == [runs["failed"]]
        assert ids(store.find_runs(job_name="nightly")) == ["manual", "skipped"]
        found = store.find_runs(job_name="nightly", schedule_time="2026-10-16T12:05:00Z")
        assert ids(found) == ["manual"]
        same = store.find_runs(job_name="nightly", schedule_time="2026-10-16T05:05:00.000-07:00")
        assert ids(same) == ["manual"]
        assert store.find_runs(task_name="nope") == []
        with pytest.raises(ValueError):
            store.find_runs()

    def test_release_refuses_a_live_lease_and_says_until_when(self, store: OperatorQueries) -> None:
        store.claim(claim_request(), T0)
        decision = store.operator_release("run-1", T0 + timedelta(seconds=30))
        assert decision.outcome is ReleaseOutcome.LEASE_LIVE
        assert decision.live_until == T0 + EXPIRED
        stored = store.get("run-1")
        assert stored is not None
        assert (stored.status, stored.attempt_id, stored.fencing_token) == (
            RunStatus.IN_PROGRESS,
            "attempt-1",
            1,
        )

    def test_forced_release_fences_out_the_old_holder(self, store: OperatorQueries) -> None:
        store.claim(claim_request(), T0)
        assert store.renew("run-1", "attempt-1", LEASE, T0 + timedelta(seconds=1))
        decision = store.operator_release("run-1", T0 + timedelta(seconds=30), force=True)
        assert (decision.outcome, decision.forced) == (ReleaseOutcome.RELEASED, True)
        stored = store.get("run-1")
        assert stored is not None
        assert stored.status is RunStatus.RELEASED
        assert stored.fencing_token == 2
        assert "operator" in (stored.error or "")
        later = T0 + timedelta(seconds=31)
        assert store.renew("run-1", "attempt-1", LEASE, later) is None
        assert not store.complete("run-1", "attempt-1", '"late"', later)
        assert not store.fail("run-1", "attempt-1", "late", later)
        claim = store.claim(claim_request(attempt_id="attempt-2"), later)
        assert claim.verdict is Verdict.CLAIMED
        assert (claim.record.fencing_token, claim.record.attempts) == (3, 2)
        assert not store.complete("run-1", "attempt-1", '"late"', later)
        assert store.complete("run-1", "attempt-2", '"ok"', later)

    def test_a_forced_release_naming_a_replaced_attempt_releases_nothing(
        self, store: OperatorQueries
    ) -> None:
        """The operator saw attempt-1 hang; a healthy retry took the run over before the
        click: the release names attempt-1, so attempt-2 keeps running alone."""
        store.claim(claim_request(), T0)
        retry = store.claim(claim_request(attempt_id="attempt-2"), T0 + EXPIRED)
        assert retry.verdict is Verdict.CLAIMED
        click = T0 + EXPIRED + timedelta(seconds=1)
        by_attempt = store.operator_release("run-1", click, force=True, attempt_id="attempt-1")
        by_token = store.operator_release("run-1", click, force=True, fencing_token=1)
        for decision in (by_attempt, by_token):
            assert decision.outcome is ReleaseOutcome.HOLDER_CHANGED
            assert decision.record is not None and decision.record.attempt_id == "attempt-2"
        stored = store.get("run-1")
        assert stored is not None
        assert (stored.status, stored.attempt_id, stored.fencing_token) == (
            RunStatus.IN_PROGRESS,
            "attempt-2",
            2,
        )
        assert store.renew("run-1", "attempt-2", LEASE, click)
        named = store.operator_release(
            "run-1", click, force=True, attempt_id="attempt-2", fencing_token=2
        )
        assert (named.outcome, named.forced) == (ReleaseOutcome.RELEASED, True)

    def test_release_of_a_crashed_attempt_needs_no_force(self, store: OperatorQueries) -> None:
        store.claim(claim_request(), T0)
        decision = store.operator_release("run-1", T0 + EXPIRED)
        assert (decision.outcome, decision.forced) == (ReleaseOutcome.RELEASED, False)
        again = store.operator_release("run-1", T0 + EXPIRED)
        assert again.outcome is ReleaseOutcome.ALREADY_RELEASED
        assert store.get("run-1").fencing_token == 2  # type: ignore[union-attr]
        store.claim(claim_request("done"), T0)
        store.complete("done", "attempt-1", None, T0)
        assert store.operator_release("done", T0).outcome is ReleaseOutcome.FINISHED
        assert store.operator_release("missing", T0).outcome is ReleaseOutcome.MISSING

    def test_replay_links_persist_and_survive_the_replays_claim(
        self, store: OperatorQueries
    ) -> None:
        store.claim(claim_request("old"), T0)
        store.fail("old", "attempt-1", "bad", T0, '{"n":1}')
        original = store.get("old")
        assert original is not None
        pending = replay_pending(original, "new", {"queue": "default", "task_name": "x"}, T0)
        assert store.add_replay(pending) == pending
        assert store.add_replay(pending.replace(claimed_at=T0 + LEASE)) == pending
        linked = store.mark_replayed("old", "new")
        assert linked is not None
        assert store.get("old") == linked
        assert linked.replayed_as == "new"
        assert store.get("new") == pending
        claim = store.claim(claim_request("new", attempt_id="a"), T0 + timedelta(seconds=1))
        assert claim.verdict is Verdict.CLAIMED
        assert (claim.record.replay_of, claim.record.fencing_token) == ("old", 1)
        assert store.get("new").replay_of == "old"  # type: ignore[union-attr]
        assert store.mark_replayed("gone", "new") is None
