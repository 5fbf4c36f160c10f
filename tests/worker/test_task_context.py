"""A handler's TaskContext: a read-only view of the attempt the executor and lease keeper own."""

from __future__ import annotations

import dataclasses
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from tasklease.errors import LeaseLost
from tasklease.worker import TaskContext
from tasklease.worker.handlers.attempt import Attempt
from tests.support.checkout import ROOT

EXPIRES = datetime(2026, 10, 16, 12, 5, tzinfo=UTC)


def documented() -> list[str]:
    """The attributes README's "How a delivery is handled" says a TaskContext carries."""
    text = (ROOT / "README.md").read_text()
    paragraph = text.split("`TaskContext` carries", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", paragraph))


def view(live: Attempt) -> TaskContext:
    return TaskContext(
        live.kind, live.handler, live.run_id, live.attempt_id, 3, 2, live.lease_expires, live=live
    )


def test_the_context_carries_every_attribute_the_readme_lists() -> None:
    ctx = view(Attempt("task", "h", "ab" * 32, "a1", EXPIRES))
    names = documented()
    assert len(names) >= 20
    for name in names:
        assert hasattr(ctx, name), name
    for method in ("check_lease", "lease_lost", "lease_seconds_left"):
        assert hasattr(ctx, method), method


def test_a_handler_cannot_change_its_context() -> None:
    ctx = view(Attempt("task", "h", "ab" * 32, "a1", EXPIRES))
    for name in [*documented(), "lease_lost"]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(ctx, name, None)
    assert not hasattr(ctx, "confirm_lease")
    assert not hasattr(ctx, "mark_lease_lost")


def test_the_view_reads_the_attempts_live_lease_and_lock() -> None:
    live = Attempt("scheduler", "nightly", "ab" * 32, "a1", EXPIRES)
    live.confirm_lease(EXPIRES, time.monotonic() + 60)
    ctx = view(live)
    assert (ctx.lease_expires, ctx.lock, ctx.lock_fencing_token) == (EXPIRES, None, None)
    live.lock, live.lock_fencing_token = "job/nightly", 7
    renewed = EXPIRES + timedelta(minutes=1)
    live.confirm_lease(renewed, time.monotonic() + 60)
    assert (ctx.lease_expires, ctx.lock, ctx.lock_fencing_token) == (renewed, "job/nightly", 7)
    assert not ctx.lease_lost and 0 < ctx.lease_seconds_left <= 60
    ctx.check_lease()
    live.mark_lease_lost()
    assert ctx.lease_lost and ctx.lease_seconds_left == 0
    with pytest.raises(LeaseLost, match="attempt a1 lost its lease"):
        ctx.check_lease()


def test_a_context_built_by_hand_is_an_attempt_of_its_own() -> None:
    ctx = TaskContext(
        kind="task",
        handler="h",
        run_id="ab" * 32,
        attempt_id="a1",
        fencing_token=1,
        attempt=1,
        lease_expires=EXPIRES,
        queue="default",
        lock="key/h/acct-1",
        lock_fencing_token=4,
    )
    assert (ctx.queue, ctx.lease_expires, ctx.lock, ctx.lock_fencing_token) == (
        "default",
        EXPIRES,
        "key/h/acct-1",
        4,
    )
    assert not ctx.lease_lost  # Unconfirmed by any store: never runs out locally.
    assert ctx.idempotency_key == "abababab-abab-abab-abab-abababababab"
