"""Group commit: concurrent changes share a transaction, each gets its own result or error."""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest

from tasklease.plumbing.group_commit import ChangeBatcher, Pending


class Recorder:
    """A commit_batch that records batch sizes and can be slowed to let a queue build up."""

    def __init__(self, pause: float = 0.0, fail_commit: bool = False) -> None:
        self.batches: list[int] = []
        self.pause = pause
        self.fail_commit = fail_commit
        self.inside = 0
        self.overlaps = 0
        self.lock = threading.Lock()

    def __call__(self, batch: list[Pending[str]]) -> None:
        with self.lock:
            self.inside += 1
            self.overlaps += self.inside > 1
        try:
            time.sleep(self.pause)
            for pending in batch:
                try:
                    pending.value = pending.work("connection")
                except Exception as exc:
                    pending.error = exc
            if self.fail_commit:
                for pending in batch:
                    pending.error = RuntimeError("commit failed")
            self.batches.append(len(batch))
        finally:
            with self.lock:
                self.inside -= 1


def test_a_lone_change_is_committed_by_its_own_thread_at_once() -> None:
    recorder = Recorder()
    group: ChangeBatcher[str] = ChangeBatcher(recorder)
    assert group.run(lambda connection: f"done on {connection}") == "done on connection"
    assert recorder.batches == [1]


def test_concurrent_changes_share_batches_and_each_gets_its_own_value() -> None:
    recorder = Recorder(pause=0.02)
    group: ChangeBatcher[str] = ChangeBatcher(recorder)
    with ThreadPoolExecutor(16) as pool:
        values = list(pool.map(lambda n: group.run(lambda _: n * 2), range(64)))
    assert values == [n * 2 for n in range(64)]
    assert sum(recorder.batches) == 64
    assert len(recorder.batches) < 64, "no change ever shared a commit"
    assert recorder.overlaps == 0, "two batches were committed at once"


def test_a_failing_change_fails_alone_and_a_failed_commit_fails_its_whole_batch() -> None:
    group: ChangeBatcher[str] = ChangeBatcher(Recorder())

    def broken(_: Any) -> None:
        raise ValueError("bad change")

    with pytest.raises(ValueError, match="bad change"):
        group.run(broken)
    assert group.run(lambda _: "still fine") == "still fine"
    failing: ChangeBatcher[str] = ChangeBatcher(Recorder(fail_commit=True))
    with pytest.raises(RuntimeError, match="commit failed"):
        failing.run(lambda _: "lost")


def test_a_commit_that_raises_fails_its_batch_and_the_next_change_still_commits() -> None:
    calls = {"n": 0}

    def flaky(batch: list[Pending[str]]) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk gone")
        for pending in batch:
            pending.value = pending.work("connection")

    group: ChangeBatcher[str] = ChangeBatcher(flaky)
    with pytest.raises(OSError, match="disk gone"):
        group.run(lambda _: "lost")
    assert group.run(lambda _: "committed") == "committed"


def test_alone_runs_on_its_own_thread_with_no_batch_in_flight_and_the_queue_waits() -> None:
    recorder = Recorder(pause=0.05)
    commits: ChangeBatcher[str] = ChangeBatcher(recorder)
    inside = threading.Event()
    release = threading.Event()
    seen: dict[str, Any] = {}

    def alone() -> str:
        seen["thread"] = threading.current_thread()
        seen["batch_in_flight"] = recorder.inside
        inside.set()
        assert release.wait(10)
        return "done alone"

    with ThreadPoolExecutor(4) as pool:
        solo = pool.submit(lambda: (threading.current_thread(), commits.alone(alone)))
        assert inside.wait(10)
        queued = [pool.submit(commits.run, partial(lambda c, n: f"{c}-{n}", n=n)) for n in range(3)]
        time.sleep(0.1)
        assert not any(f.done() for f in queued)  # They wait for the one running alone.
        release.set()
        thread, value = solo.result(10)
        assert value == "done alone"
        assert [f.result(10) for f in queued] == ["connection-0", "connection-1", "connection-2"]
    assert seen == {"thread": thread, "batch_in_flight": 0}
    assert recorder.overlaps == 0


def test_a_change_from_inside_alone_is_refused_rather_than_waiting_for_itself() -> None:
    commits: ChangeBatcher[str] = ChangeBatcher(Recorder())
    with pytest.raises(RuntimeError, match="wait for itself"):
        commits.alone(lambda: commits.run(lambda c: c))
    assert commits.run(lambda c: c) == "connection"  # The lead was handed back.


def test_a_change_from_a_copy_of_the_alone_context_on_another_thread_is_refused() -> None:
    """An async handler runs in a copy of the request thread's context on the loop's thread."""
    commits: ChangeBatcher[str] = ChangeBatcher(Recorder())

    def elsewhere() -> None:
        context = contextvars.copy_context()
        errors: list[BaseException] = []

        def change() -> None:
            try:
                context.run(commits.run, lambda c: c)
            except RuntimeError as exc:
                errors.append(exc)

        thread = threading.Thread(target=change, daemon=True)
        thread.start()
        thread.join(5)
        assert not thread.is_alive(), "the change waited for the action it was part of"
        raise errors[0]

    with pytest.raises(RuntimeError, match="wait for itself"):
        commits.alone(elsewhere)
    assert commits.run(lambda c: c) == "connection"
