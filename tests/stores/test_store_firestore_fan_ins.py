"""FirestoreStore's joins across several shards: what the contract's one-shard joins cannot
show (the root written only by a shard's first and filling children, counts summed over
shards, a join kept while any shard is live), their round trips, and a commit that landed
although its call failed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from tasklease import joins
from tasklease.joins import Member
from tasklease.testing.contract_support import T0, claim_request
from tasklease.worker.core.fan_in import JOIN_KEEP_FLOOR
from tasklease.worker.stores import FirestoreStore
from tests.support.firestore import IGNORES_UPDATE_TIME, PROJECT, RpcCounter, unique_collection
from tests.support.firestore_faults import LANDED_THEN_FAILED
from tests.support.stores import closed_after_the_test

KEEP = timedelta(days=7)


@pytest.fixture
def store(firestore_host: str | None) -> FirestoreStore:
    return closed_after_the_test(
        FirestoreStore.from_options(collection=unique_collection(), project=PROJECT)
    )


def sharded(per_shard: list[int], parent: str = "parent-1") -> list[Member]:
    """A join's members over ``len(per_shard)`` shards, ``per_shard[n]`` in shard ``n``, in
    shard order (keys ``s<shard>-<n>``)."""
    keys = [f"s{shard}-{n}" for shard, size in enumerate(per_shard) for n in range(size)]
    join = joins.join_id(parent, 0, "child", "summarise", keys)
    return [
        Member(join, parent, "summarise", len(keys), f"s{shard}-{n}", shard, len(per_shard), size)
        for shard, size in enumerate(per_shard)
        for n in range(size)
    ]


def finish(store: FirestoreStore, member: Member, at: Any = T0, keep: timedelta = KEEP) -> Any:
    run_id = f"child-{member.key}"
    store.claim(claim_request(run_id, f"a-{member.key}"), at)
    progress = store.complete_member(member, run_id, f"a-{member.key}", '"ok"', at, keep_for=keep)
    assert progress is not None
    return progress


def root_version(store: FirestoreStore, join_id: str) -> Any:
    return store.fan_ins.root(join_id).get().update_time


def test_a_join_over_three_shards_closes_with_the_last_shard_filled(
    store: FirestoreStore,
) -> None:
    members = sharded([2, 3, 1])
    closed = [finish(store, member).closed for member in members]
    assert closed == [False] * 5 + [True]
    join = store.get_fan_in(members[0].join_id)
    assert join is not None
    assert (join.expected, join.completed, join.shards, join.shards_done) == (6, 6, 3, 3)
    assert [e.key for e in store.fan_in_entries(join.join_id)] == sorted(m.key for m in members)
    assert [e.shard for e in store.fan_in_entries(join.join_id, after="s1-2")] == [2]


def test_only_a_shards_first_and_filling_children_write_the_root(store: FirestoreStore) -> None:
    first, middle, last = sharded([3])
    finish(store, first)
    opened = root_version(store, first.join_id)
    assert store.get_fan_in(first.join_id) is not None  # Visible from its first child on.
    finish(store, middle)
    assert root_version(store, first.join_id) == opened
    join = store.get_fan_in(first.join_id)
    assert join is not None
    assert (join.done, join.shards_done) == (2, 0)  # Counted in the shard only.
    assert finish(store, last).closed
    assert root_version(store, first.join_id) != opened


def test_a_childs_finish_is_one_read_and_one_commit_and_a_recount_one_read(
    store: FirestoreStore,
) -> None:
    first, second = sharded([2])
    store.claim(claim_request("child-s0-0", "a"), T0)
    rpcs = RpcCounter(store.client)
    store.complete_member(first, "child-s0-0", "a", None, T0, keep_for=KEEP)
    assert rpcs.take() == ["batch_get_documents", "commit"]
    assert not store.count_member(first, "child-s0-0", T0, keep_for=KEEP).closed
    assert rpcs.take() == ["batch_get_documents"]
    finish(store, second)


class ScriptedCommits:
    """The store's next Commits (``DocumentReference.create`` and ``update`` commit through a
    batch too) run as scripted: each step gets the real commit to call, or not."""

    def __init__(self, store: FirestoreStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.script: list[Callable[[Callable[[], Any]], Any]] = []
        client = store.client
        batches = client.batch

        def batch() -> Any:
            made: Any = batches()
            commit = made.commit

            def scripted(**options: Any) -> Any:
                if not self.script:
                    return commit(**options)
                return self.script.pop(0)(lambda: commit(**options))

            made.commit = scripted
            return made

        monkeypatch.setattr(client, "batch", batch)


@pytest.fixture
def commits(store: FirestoreStore, monkeypatch: pytest.MonkeyPatch) -> ScriptedCommits:
    return ScriptedCommits(store, monkeypatch)


def test_a_commit_that_landed_although_its_call_failed_counts_once(
    store: FirestoreStore, commits: ScriptedCommits
) -> None:
    first, second = sharded([2])
    store.claim(claim_request("child-s0-0", "a"), T0)

    def landed_then_failed(commit: Callable[[], Any]) -> Any:
        commit()
        raise LANDED_THEN_FAILED

    commits.script.append(landed_then_failed)
    progress = store.complete_member(first, "child-s0-0", "a", None, T0, keep_for=KEEP)
    assert progress is not None  # Read again: finished and counted, and not counted again.
    assert not progress.closed
    assert not commits.script
    assert finish(store, second).closed
    join = store.get_fan_in(first.join_id)
    assert join is not None
    assert (join.done, join.shards_done) == (2, 1)


def test_a_child_counted_between_anothers_read_and_commit_refuses_that_commit_whole(
    store: FirestoreStore, commits: ScriptedCommits
) -> None:
    """The other child creates the shard first: the commit's create of it is refused, and
    with it the run's completion and the entry; read again, it counts in that shard."""
    first, second = sharded([2])
    store.claim(claim_request("child-s0-0", "a"), T0)
    seen: list[Any] = []

    def another_child_first(commit: Callable[[], Any]) -> Any:
        finish(store, second)
        try:
            return commit()  # Refused: the shard it creates exists now.
        finally:
            seen.extend([store.get("child-s0-0"), store.fan_in_entries(first.join_id)])

    commits.script.append(another_child_first)
    progress = store.complete_member(first, "child-s0-0", "a", '"late"', T0, keep_for=KEEP)
    assert progress is not None
    assert progress.closed  # The second attempt filled the shard.
    in_progress, entries = seen
    assert in_progress.status.value == "in_progress"  # Nothing of the refused commit landed.
    assert [e.key for e in entries] == ["s0-1"]
    join = store.get_fan_in(first.join_id)
    assert join is not None
    assert (join.done, join.shards_done) == (2, 1)


def test_a_join_is_kept_while_any_shard_is_live(store: FirestoreStore) -> None:
    first, later, _ = sharded([3])
    hour = timedelta(hours=1)
    # Kept JOIN_KEEP_FLOOR past each count (longer than the children's hour of retention).
    finish(store, first, T0, hour)  # The root: kept until T0 + floor.
    finish(store, later, T0 + 50 * timedelta(minutes=1), hour)  # Its shard: 50 min more.
    store.purge_expired(T0 + JOIN_KEEP_FLOOR + 10 * timedelta(minutes=1))
    assert store.get_fan_in(first.join_id) is not None
    store.purge_expired(T0 + JOIN_KEEP_FLOOR + 2 * hour)
    assert store.get_fan_in(first.join_id) is None
    assert store.fan_in_entries(first.join_id) == []


def test_a_parents_joins_are_summed_over_their_shards(store: FirestoreStore) -> None:
    members = sharded([1, 2], parent="p-1")
    for member in members[:2]:
        finish(store, member)
    (listed,) = store.fan_ins_of("p-1")
    assert (listed.done, listed.shards_done, listed.closed) == (2, 1, False)


@IGNORES_UPDATE_TIME
def test_children_of_four_shards_finishing_at_once_close_the_join_once(
    store: FirestoreStore,
) -> None:
    """Shards filling at once contend on the root; each child also races its duplicate."""
    members = sharded([10, 10, 10, 10])
    for member in members:
        store.claim(claim_request(f"child-{member.key}", f"a-{member.key}"), T0)
    start = threading.Barrier(len(members) * 2)
    seen: list[bool] = []

    def run(member: Member) -> None:
        start.wait()
        run_id = f"child-{member.key}"
        progress = store.complete_member(member, run_id, f"a-{member.key}", "1", T0, keep_for=KEEP)
        assert progress is not None
        seen.append(progress.closed)

    threads = [threading.Thread(target=run, args=(m,)) for m in members for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(seen) == 80
    assert any(seen)
    join = store.get_fan_in(members[0].join_id)
    assert join is not None
    assert (join.done, join.shards_done, join.closed) == (40, 4, True)
    assert len(store.fan_in_entries(join.join_id)) == 40
