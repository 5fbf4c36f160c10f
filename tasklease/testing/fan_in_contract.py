"""The fan-in part of the store contract: what a :class:`~tasklease.worker.stores.base.fan_ins.
FanInStore` must do so that a join closes once, with every child counted once.

Use it as the other contract suites are used: a test class that inherits
:class:`FanInContract` and provides a ``store`` fixture (and, for :class:`FanInCrossProcess`,
a picklable ``store_factory``).
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tasklease import joins
from tasklease.errors import StoreUnavailable
from tasklease.joins import Member
from tasklease.testing.contract_support import EXPIRED, T0, claim_request
from tasklease.worker.core.fan_in import JOIN_KEEP_FLOOR, Progress
from tasklease.worker.core.records import RunStatus, Verdict
from tasklease.worker.stores.base.fan_ins import FanInStore

__all__ = ["FanInContract", "FanInCrossProcess", "family"]

KEEP = timedelta(days=7)


def family(count: int, parent: str = "parent-1", then: str = "summarise") -> list[Member]:
    """The members of one join of ``count`` children (keys ``k000``, ``k001``, ...)."""
    keys = [f"k{index:03d}" for index in range(count)]
    join = joins.join_id(parent, 0, "child", then, keys)
    return joins.members(join, parent, then, keys)


def _child(store: FanInStore, member: Member, attempt: str = "a1", at: Any = T0) -> None:
    run_id = f"child-{member.key}"
    claim = store.claim(claim_request(run_id, f"{attempt}-{member.key}"), at)
    assert claim.verdict is Verdict.CLAIMED, claim


class FanInContract:
    """Semantics every :class:`FanInStore` must have (with a ``store`` fixture)."""

    def test_each_child_counts_once_and_the_last_closes_the_join(self, store: FanInStore) -> None:
        members = family(3)
        for index, member in enumerate(members):
            _child(store, member)
            progress = store.complete_member(
                member,
                f"child-{member.key}",
                f"a1-{member.key}",
                json.dumps(index),
                T0,
                keep_for=KEEP,
            )
            assert progress is not None
            assert progress.closed is (index == 2)
            assert not progress.then_enqueued
        join = store.get_fan_in(members[0].join_id)
        assert join is not None
        assert (join.expected, join.completed, join.failed, join.done) == (3, 3, 0, 3)
        assert join.parent_run_id == "parent-1"
        assert join.then == "summarise"
        record = store.get("child-k001")
        assert record is not None
        assert record.status is RunStatus.COMPLETED

    def test_a_retried_finish_and_a_recount_never_count_twice(self, store: FanInStore) -> None:
        first, second = family(2)
        _child(store, first)
        run_id, attempt = "child-k000", "a1-k000"
        assert store.complete_member(first, run_id, attempt, "1", T0, keep_for=KEEP) is not None
        # The same call again (its answer was lost): recognised, not counted again.
        again = store.complete_member(first, run_id, attempt, "1", T0, keep_for=KEEP)
        assert again is not None
        assert not again.closed
        recount = store.count_member(first, run_id, T0, keep_for=KEEP)
        assert not recount.closed
        join = store.get_fan_in(first.join_id)
        assert join is not None
        assert join.done == 1
        assert [e.key for e in store.fan_in_entries(first.join_id)] == ["k000"]
        _child(store, second)
        closing = store.complete_member(second, "child-k001", "a1-k001", "2", T0, keep_for=KEEP)
        assert closing is not None
        assert closing.closed

    def test_a_stale_attempt_neither_finishes_nor_counts(self, store: FanInStore) -> None:
        (member,) = family(1)
        _child(store, member)
        taken = store.claim(claim_request("child-k000", "a2"), T0 + EXPIRED)
        assert taken.verdict is Verdict.CLAIMED
        late = store.complete_member(member, "child-k000", "a1-k000", "1", T0 + EXPIRED)
        assert late is None
        assert store.get_fan_in(member.join_id) is None or not store.fan_in_entries(member.join_id)
        done = store.complete_member(member, "child-k000", "a2", "2", T0 + EXPIRED, keep_for=KEEP)
        assert done is not None
        assert done.closed
        (entry,) = store.fan_in_entries(member.join_id)
        assert (entry.run_id, entry.status, entry.result_json) == (
            "child-k000",
            RunStatus.COMPLETED,
            "2",
        )

    def test_a_failed_child_counts_with_its_error_and_no_result(self, store: FanInStore) -> None:
        ok, bad = family(2)
        _child(store, ok)
        store.complete_member(ok, "child-k000", "a1-k000", '{"n":1}', T0, keep_for=KEEP)
        _child(store, bad)
        progress = store.fail_member(
            bad, "child-k001", "a1-k001", "boom", T0, payload="{}", keep_for=KEEP
        )
        assert progress is not None
        assert progress.closed
        join = store.get_fan_in(ok.join_id)
        assert join is not None
        assert (join.completed, join.failed) == (1, 1)
        entries = store.fan_in_entries(ok.join_id)
        assert [(e.key, e.status, e.result_json, e.error) for e in entries] == [
            ("k000", RunStatus.COMPLETED, '{"n":1}', None),
            ("k001", RunStatus.FAILED, None, "boom"),
        ]

    def test_a_cancelled_child_counts_as_failed_by_its_end_or_by_a_recount(
        self, store: FanInStore
    ) -> None:
        held, waiting = family(2)
        _child(store, held)
        progress = store.end_cancelled_member(
            held, "child-k000", "a1-k000", T0, keep_for=KEEP, by="the parent's cancellation"
        )
        assert progress is not None and not progress.closed
        # A child nothing runs is cancelled by the operator's write, without its join; the
        # next delivery's recount counts it.
        _child(store, waiting)
        assert store.release("child-k001", "a1-k001", "boom", T0)
        assert store.cancel_run("child-k001", "operator", T0).record is not None
        assert store.count_member(waiting, "child-k001", T0, keep_for=KEEP).closed
        assert store.count_member(waiting, "child-k001", T0, keep_for=KEEP).closed  # Once.
        join = store.get_fan_in(held.join_id)
        assert join is not None
        assert (join.completed, join.failed, join.done) == (0, 2, 2)
        entries = store.fan_in_entries(held.join_id)
        assert [(e.key, e.status, e.result_json, e.error) for e in entries] == [
            ("k000", RunStatus.CANCELLED, None, "cancelled by the parent's cancellation"),
            ("k001", RunStatus.CANCELLED, None, "cancelled by operator"),
        ]

    def test_a_child_not_yet_final_is_not_counted(self, store: FanInStore) -> None:
        (member,) = family(1)
        _child(store, member)
        assert not store.count_member(member, "child-k000", T0, keep_for=KEEP).closed
        assert store.release("child-k000", "a1-k000", "retry me", T0)
        assert not store.count_member(member, "child-k000", T0, keep_for=KEEP).closed
        assert not store.fan_in_entries(member.join_id)

    def test_a_child_finished_outside_its_join_is_counted_by_a_recount(
        self, store: FanInStore
    ) -> None:
        (member,) = family(1)
        _child(store, member)
        assert store.complete("child-k000", "a1-k000", '"done"', T0)
        assert store.count_member(member, "child-k000", T0, keep_for=KEEP).closed
        assert store.count_member(member, "child-k000", T0, keep_for=KEEP).closed
        join = store.get_fan_in(member.join_id)
        assert join is not None
        assert join.done == 1

    def test_then_enqueued_is_noted_once(self, store: FanInStore) -> None:
        (member,) = family(1)
        _child(store, member)
        store.complete_member(member, "child-k000", "a1-k000", "1", T0, keep_for=KEEP)
        store.mark_then_enqueued(member.join_id, T0 + timedelta(seconds=1))
        store.mark_then_enqueued(member.join_id, T0 + timedelta(seconds=9))
        join = store.get_fan_in(member.join_id)
        assert join is not None
        assert join.then_enqueued_at == T0 + timedelta(seconds=1)
        assert store.count_member(member, "child-k000", T0, keep_for=KEEP).then_enqueued

    def test_progress_says_closed_and_then_noted(self, store: FanInStore) -> None:
        first, second = family(2)
        assert store.fan_in_progress(first.join_id) is None
        _child(store, first)
        store.complete_member(first, "child-k000", "a1-k000", "1", T0, keep_for=KEEP)
        progress = store.fan_in_progress(first.join_id)
        assert progress is not None
        assert (progress.closed, progress.then_enqueued) == (False, False)
        _child(store, second)
        store.complete_member(second, "child-k001", "a1-k001", "2", T0, keep_for=KEEP)
        store.mark_then_enqueued(first.join_id, T0)
        progress = store.fan_in_progress(first.join_id)
        assert progress is not None
        assert (progress.closed, progress.then_enqueued) == (True, True)

    def test_entries_page_by_key(self, store: FanInStore) -> None:
        members = family(25)
        for member in reversed(members):
            _child(store, member)
            store.complete_member(
                member, f"child-{member.key}", f"a1-{member.key}", "0", T0, keep_for=KEEP
            )
        join_id = members[0].join_id
        first = store.fan_in_entries(join_id, limit=10)
        assert [e.key for e in first] == [f"k{i:03d}" for i in range(10)]
        rest = store.fan_in_entries(join_id, after=first[-1].key, limit=100)
        assert [e.key for e in rest] == [f"k{i:03d}" for i in range(10, 25)]
        join = store.get_fan_in(join_id)
        assert join is not None
        assert join.closed

    def test_a_parents_joins_are_listed(self, store: FanInStore) -> None:
        (one,) = family(1, parent="p-9", then="a")
        (two,) = family(1, parent="p-9", then="b")
        (other,) = family(1, parent="p-8")
        for member, run in ((one, "r1"), (two, "r2"), (other, "r3")):
            store.claim(claim_request(run, "x"), T0)
            store.complete_member(member, run, "x", None, T0, keep_for=KEEP)
        listed = store.fan_ins_of("p-9")
        assert {j.join_id for j in listed} == {one.join_id, two.join_id}
        assert store.fan_ins_of("nobody") == []

    def test_joins_expire_with_their_entries(self, store: FanInStore) -> None:
        (member,) = family(1)
        _child(store, member)
        store.complete_member(member, "child-k000", "a1-k000", "1", T0, keep_for=timedelta(hours=1))
        # Kept past the child's retention: an open join must keep its counts until its last
        # child, however late, arrives.
        store.purge_expired(T0 + timedelta(days=30))
        assert store.get_fan_in(member.join_id) is not None
        store.purge_expired(T0 + JOIN_KEEP_FLOOR + timedelta(days=1))
        assert store.get_fan_in(member.join_id) is None
        assert store.fan_in_entries(member.join_id) == []

    def test_children_finishing_at_once_count_exactly_once_each(self, store: FanInStore) -> None:
        members = family(40)
        for member in members:
            _child(store, member)
        closed = _finish_all_at_once(store, members)
        assert closed >= 1  # Several calls may see it closed; never none.
        join = store.get_fan_in(members[0].join_id)
        assert join is not None
        assert (join.done, join.expected) == (40, 40)
        assert len(store.fan_in_entries(members[0].join_id, limit=100)) == 40


def _finish(store: FanInStore, member: Member) -> Progress | None:
    """Complete ``member``'s run as the worker does: a call the store answered with
    ``StoreUnavailable`` (Spanner's emulator aborts all but one transaction at a time) is
    tried again, and may have landed: the contract is that the retry recognises it."""
    for _ in range(100):
        try:
            return store.complete_member(
                member, f"child-{member.key}", f"a1-{member.key}", "1", T0, keep_for=KEEP
            )
        except StoreUnavailable:
            time.sleep(0.02)
    raise AssertionError(f"the store stayed unavailable finishing {member.key}")


def _finish_all_at_once(store: FanInStore, members: list[Member]) -> int:
    """Complete every member from its own thread at once (each twice: a duplicate races its
    own finish); return how many calls saw the join closed."""
    start = threading.Barrier(len(members) * 2)
    closed = 0
    guard = threading.Lock()

    def finish(member: Member) -> None:
        nonlocal closed
        start.wait()
        progress = _finish(store, member)
        assert progress is not None
        if progress.closed:
            with guard:
                closed += 1

    threads = [threading.Thread(target=finish, args=(m,)) for m in members for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return closed


class FanInCrossProcess:
    """For stores several processes share: children finishing in four processes at once."""

    def test_children_in_four_processes_count_once_each(
        self, store_factory: Callable[[], FanInStore]
    ) -> None:
        members = family(24)
        store = store_factory()
        for member in members:
            _child(store, member)
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(4)
        processes = [
            context.Process(target=_finish_in_process, args=(store_factory, members, barrier))
            for _ in range(4)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=120)
            assert process.exitcode == 0
        join = store.get_fan_in(members[0].join_id)
        assert join is not None
        assert (join.done, join.completed) == (24, 24)
        assert len(store.fan_in_entries(members[0].join_id)) == 24


def _finish_in_process(
    store_factory: Callable[[], FanInStore], members: list[Member], barrier: Any
) -> None:
    store = store_factory()
    barrier.wait()
    for member in members:  # Every process finishes every child: three of four are retries.
        assert _finish(store, member) is not None
    store.close()
