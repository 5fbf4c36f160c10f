"""A fan-in's names, shared by the producer that fans out and the worker that joins: the
join's id, each child's :class:`Member` (the header it carries) and the ``then`` task's key.
Standard library only: the producer imports no worker module.

A store may spread a join's counts over ``shards`` records (Firestore: a document takes about
one sustained write a second). Each child names its shard and how many children that shard
holds, so the child that fills a shard knows it without reading the others.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from tasklease.errors import InvalidDelivery

__all__ = [
    "CHILDREN_PER_SHARD",
    "MAX_SHARDS",
    "Member",
    "join_id",
    "members",
    "parse_header",
    "shard_count",
    "shard_of",
    "then_key",
]

CHILDREN_PER_SHARD = 100  # A sharded store's join takes one shard per this many children.
MAX_SHARDS = 100
_HEADER_VERSION = "v1"


@dataclass(frozen=True)
class Member:
    """What a child of a join carries (its header): the join, its parent, the handler to run
    when every child has finished, how many children there are, and its own key and shard."""

    join_id: str
    parent_run_id: str
    then: str
    expected: int
    key: str  # The item key the fan-out was given for this child.
    shard: int = 0
    shards: int = 1
    shard_expected: int = 0  # How many children share this child's shard (expected if 1).

    def header(self) -> str:
        return ";".join(
            [
                _HEADER_VERSION,
                self.join_id,
                quote(self.parent_run_id, safe=""),
                self.then,
                str(self.expected),
                f"{self.shard}/{self.shards}",
                str(self.shard_expected),
                quote(self.key, safe=""),
            ]
        )


def shard_count(expected: int) -> int:
    """How many shards a sharded store spreads a join of ``expected`` children over."""
    return max(1, min(MAX_SHARDS, math.ceil(expected / CHILDREN_PER_SHARD)))


def shard_of(key: str, shards: int) -> int:
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def join_id(
    parent_run_id: str, continuation: int, task_name: str, then: str, keys: Sequence[str]
) -> str:
    """The join of one fan-out: the same for every attempt of the parent's delivery that fans
    out the same items (so a retried parent names the same join and children), another for
    different items (a parent whose items changed between attempts starts a join of its own,
    never one that mixes both sets)."""
    items = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()
    text = "\n".join([parent_run_id, str(continuation), task_name, then, items])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def members(join: str, parent_run_id: str, then: str, keys: Sequence[str]) -> list[Member]:
    """One :class:`Member` per key, in order, with shards assigned."""
    expected = len(keys)
    shards = shard_count(expected)
    assigned = [shard_of(key, shards) for key in keys]
    sizes = [0] * shards
    for shard in assigned:
        sizes[shard] += 1
    return [
        Member(join, parent_run_id, then, expected, key, shard, shards, sizes[shard])
        for key, shard in zip(keys, assigned, strict=True)
    ]


def then_key(join: str) -> str:
    """The task key of a join's ``then`` task: one task per join."""
    return f"fan-in/{join}"


def parse_header(value: str) -> Member:
    """A child's :data:`~tasklease.protocol.FAN_IN_HEADER`; raises InvalidDelivery."""
    parts = value.split(";")
    if len(parts) != 8 or parts[0] != _HEADER_VERSION:
        raise InvalidDelivery("malformed fan-in header")
    _, join, parent, then, expected, shard_part, shard_expected, key = parts
    try:
        shard_text, shards_text = shard_part.split("/")
        numbers = int(expected), int(shard_text), int(shards_text), int(shard_expected)
    except ValueError:
        raise InvalidDelivery("malformed fan-in header: counts are not numbers") from None
    count, shard, shards, in_shard = numbers
    if not (len(join) == 32 and all(ch in "0123456789abcdef" for ch in join)):
        raise InvalidDelivery("malformed fan-in header: bad join id")
    if count < 1 or not 0 <= shard < shards <= MAX_SHARDS or not 1 <= in_shard <= count:
        raise InvalidDelivery("malformed fan-in header: counts out of range")
    if not then or not all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in then):
        raise InvalidDelivery("malformed fan-in header: bad handler name")
    return Member(join, unquote(parent), then, count, unquote(key), shard, shards, in_shard)
