"""Finding: a store of one's own ("Writing a store" in the README) imports what it subclasses
and the types of its primitives from ``tasklease.worker.stores.base``: ``LeaseStore``,
``Change`` (what ``_read_modify_write`` applies), ``Moment``, ``Update`` and ``resolve``. When
the stores became one package per backend, ``base`` became a package that exported nothing,
so every such store failed at import (``cannot import name 'LeaseStore'``). The names the
module offered are offered there again: the very objects the shipped stores build on."""

from __future__ import annotations

import importlib

from tasklease.worker import stores
from tasklease.worker.stores.base import store as base_store

# Every public name of its own the module tasklease.worker.stores.base offered.
OFFERED = ("Change", "LeaseStore", "LockChange", "Moment", "RunReader", "Update", "resolve")


def test_every_name_a_store_imported_from_stores_base_is_still_there() -> None:
    base = importlib.import_module("tasklease.worker.stores.base")
    assert [name for name in OFFERED if not hasattr(base, name)] == []
    assert all(getattr(base, name) is getattr(base_store, name) for name in OFFERED)
    assert base.LeaseStore is stores.LeaseStore


# What a store of one's own needs beyond them, from the modules it found them in before the
# stores became packages (the codec, the transactional and tally capabilities' types).
FOR_A_STORE_OF_ONES_OWN = (
    *OFFERED,
    "RecordCodec",
    "TransactionOutcome",
    "Work",
    "StepWork",
    "TallyKey",
    "MinuteCounts",
    "TALLY_KEPT",
)


def test_a_store_of_ones_own_finds_every_name_it_needs_in_tasklease_worker_stores() -> None:
    assert [name for name in FOR_A_STORE_OF_ONES_OWN if name not in stores.__all__] == []
    assert all(hasattr(stores, name) for name in FOR_A_STORE_OF_ONES_OWN)
