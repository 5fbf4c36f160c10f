"""Properties of task IDs."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tasklease.producer import task_id
from tasklease.producer.naming import random_task_id

VALID = re.compile(r"[A-Za-z0-9_-]{1,500}")
names = st.text(
    alphabet=st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=40
)
keys = st.text(min_size=1, max_size=2000)


@given(names, keys)
def test_task_ids_use_only_the_allowed_charset_and_length(task_name: str, key: str) -> None:
    assert VALID.fullmatch(task_id(task_name, key))


@given(names, keys)
def test_task_ids_are_deterministic(task_name: str, key: str) -> None:
    assert task_id(task_name, key) == task_id(task_name, key)


@settings(max_examples=50)
@given(st.lists(st.tuples(names, keys), min_size=2, max_size=200, unique=True))
def test_distinct_pairs_never_share_an_id(pairs: list[tuple[str, str]]) -> None:
    assert len({task_id(name, key) for name, key in pairs}) == len(pairs)


def test_no_collisions_on_a_large_sample_of_similar_keys() -> None:
    ids = {
        task_id(name, f"{sep}{n}")
        for name in ("a", "a-", "a_b")
        for sep in ("", "-", "_", "/")
        for n in range(25_000)
    }
    assert len(ids) == 3 * 4 * 25_000


def test_keys_that_sanitise_alike_still_get_different_ids() -> None:
    assert task_id("t", "a/b") != task_id("t", "a_b") != task_id("t", "a b")
    assert task_id("t-a", "b") != task_id("t", "a-b")


def test_sequential_keys_get_spread_out_prefixes() -> None:
    prefixes = [task_id("report", f"order-{n}")[:4] for n in range(1000)]
    assert len(set(prefixes)) > 900
    assert prefixes != sorted(prefixes)


def test_id_starts_with_the_hash_and_keeps_a_readable_part() -> None:
    ident = task_id("send_receipt", "order-42")
    assert re.fullmatch(r"[0-9a-f]{32}-send_receipt-order-42", ident)


def test_random_ids_are_unique_and_valid() -> None:
    ids = {random_task_id("t") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(VALID.fullmatch(i) for i in ids)
