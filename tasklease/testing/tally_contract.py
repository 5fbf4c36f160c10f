"""The delivery tally part of the store contract: what a
:class:`~tasklease.worker.stores.base.tally.DeliveryTally` store must do for the
dashboard's deliveries chart. Mix :class:`TallyContract` into a test class with a ``store``
fixture of a store that has the capability."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from tasklease.testing.contract_support import T0
from tasklease.worker.stores.base.store import LeaseStore
from tasklease.worker.stores.base.tally import TALLY_KEPT, DeliveryTally, TallyKey

MINUTE = timedelta(minutes=1)
PROCESSED = TallyKey("task", "send_receipt", "processed")
DUPLICATE = TallyKey("task", "send_receipt", "duplicate")
JOB = TallyKey("scheduler", "nightly", "in_progress")


class TallyContract:
    """Semantics every :class:`DeliveryTally` store must have (with a ``store`` fixture)."""

    def test_counts_are_summed_over_instances_by_minute_and_key(self, store: DeliveryTally) -> None:
        store.write_delivery_counts("a", {T0: {PROCESSED: 3, DUPLICATE: 1}, T0 + MINUTE: {JOB: 2}})
        store.write_delivery_counts("b", {T0: {PROCESSED: 4}})
        assert store.delivery_counts(T0) == {
            T0: Counter({PROCESSED: 7, DUPLICATE: 1}),
            T0 + MINUTE: Counter({JOB: 2}),
        }
        assert store.delivery_counts(T0 + MINUTE) == {T0 + MINUTE: Counter({JOB: 2})}

    def test_a_write_replaces_its_own_instances_totals_so_a_retried_write_counts_once(
        self, store: DeliveryTally
    ) -> None:
        store.write_delivery_counts("a", {T0: {PROCESSED: 3}})
        store.write_delivery_counts("a", {T0: {PROCESSED: 3}})  # The same write, retried.
        store.write_delivery_counts("b", {T0: {PROCESSED: 1}})
        assert store.delivery_counts(T0)[T0][PROCESSED] == 4
        store.write_delivery_counts("a", {T0: {PROCESSED: 5, DUPLICATE: 2}})  # Grown totals.
        assert store.delivery_counts(T0)[T0] == Counter({PROCESSED: 6, DUPLICATE: 2})

    def test_minutes_are_read_on_the_minute_whatever_second_was_given(
        self, store: DeliveryTally
    ) -> None:
        store.write_delivery_counts("a", {T0 + timedelta(seconds=42): {PROCESSED: 1}})
        assert store.delivery_counts(T0 + timedelta(seconds=59)) == {T0: Counter({PROCESSED: 1})}
        assert store.delivery_counts(T0 + MINUTE) == {}

    def test_nothing_written_reads_as_no_counts(self, store: DeliveryTally) -> None:
        assert store.delivery_counts(T0) == {}

    def test_purge_expired_drops_minutes_older_than_the_kept_window(
        self, store: DeliveryTally
    ) -> None:
        store.write_delivery_counts("a", {T0: {PROCESSED: 1}, T0 + TALLY_KEPT: {PROCESSED: 2}})
        assert isinstance(store, LeaseStore)
        assert store.purge_expired(T0 + TALLY_KEPT + MINUTE) >= 1
        assert store.delivery_counts(T0) == {T0 + TALLY_KEPT: Counter({PROCESSED: 2})}
        assert store.purge_delivery_counts(T0 + TALLY_KEPT + MINUTE) == 1
        assert store.delivery_counts(T0) == {}
