"""Finding (by the seeded simulation, seed 11 of 300 lifecycles on memory): a delivery that
ends with ``ctx.continue_later`` records its continuation after enqueueing it. When that
record committed but its answer was lost, the continuation's own delivery claimed the run
before the retry, and the retry's refusal was taken for a takeover: 409 ``lost_claim`` while
the attempt's lease still held, and a needless redelivery of a finished delivery."""

from __future__ import annotations

from tasklease.testing.simulation import simulate
from tasklease.worker.stores import MemoryStore


def test_a_continuation_whose_record_landed_unheard_is_answered_as_continued() -> None:
    report = simulate(MemoryStore, seed=11, lifecycles=300, store_name="memory")

    refused = [v for v in report.found if v.invariant == "refused_while_holding"]
    assert refused == [], refused[0].detail
    assert report.faults.get("lost_answer", 0) > 0
