"""The stores ``create_app``'s refusal (and the README's table) name as able to run a
``transactional=True`` handler must be able to: a user told to switch to FirestoreStore or
SpannerStore gets the same refusal again."""

from __future__ import annotations

import re

from tasklease.worker import stores
from tasklease.worker.stores.base.transactional import TRANSACTIONAL_STORES, TransactionalStore


def test_every_store_the_transactional_refusal_names_implements_transactional_store() -> None:
    named = re.findall(r"\w+Store", TRANSACTIONAL_STORES)
    assert "FirestoreStore" in named and "SpannerStore" in named
    not_transactional = [
        name for name in named if not issubclass(getattr(stores, name), TransactionalStore)
    ]
    assert not_transactional == []
