"""The relay's side of the Firestore outbox (:mod:`tasklease.outbox.firestore`): claim, mark,
report, over ``firestore://?collection=tasklease_outbox&database=(default)&project=P``."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tasklease.outbox.base import Failed, OutboxDB, Status
from tasklease.outbox.entries import FAILED, PENDING, SENT, Entry, Undecodable, decode
from tasklease.outbox.firestore import _CHUNK, COLLECTION, doc_id
from tasklease.plumbing.url_secrets import shown_url

_OPTIONS = {"collection", "database", "project"}
_Change = Callable[[dict[str, Any]], dict[str, Any]]  # An entry's document -> its update.


class FirestoreOutbox(OutboxDB):
    """One relay's Firestore client; its claims and marks are transactions."""

    dialect = "firestore"

    def __init__(
        self,
        collection: str = COLLECTION,
        database: str = "(default)",
        project: str | None = None,
    ) -> None:
        from google.cloud import firestore  # noqa: PLC0415 - the firestore extra.

        self._firestore = firestore
        self._client = firestore.Client(
            project=project or os.environ.get("GOOGLE_CLOUD_PROJECT"), database=database
        )
        self.collection = collection
        self._entries = self._client.collection(collection)
        self._watch: Any = None
        self._added = threading.Event()

    @classmethod
    def from_url(cls, url: str) -> FirestoreOutbox:
        options = {key: values[-1] for key, values in parse_qs(urlsplit(url).query).items()}
        if unknown := set(options) - _OPTIONS:
            raise ValueError(f"outbox URL {shown_url(url)!r}: unknown options {sorted(unknown)}")
        return cls(**options)

    def wait(self, timeout: float) -> bool:
        """Firestore's fast path: a listener on the newest pending entry wakes the relay when
        a commit adds one (at most ``timeout`` s). It watches one document, not the outbox."""
        if self._watch is None:
            from google.cloud.firestore_v1 import Query  # noqa: PLC0415

            def changed(_snapshots: Any, changes: Any, _read_time: Any) -> None:
                if any(change.type.name == "ADDED" for change in changes):
                    self._added.set()

            newest = self._where("state", "==", PENDING).order_by(
                "created_at", direction=Query.DESCENDING
            )
            self._watch = newest.limit(1).on_snapshot(changed)
        fired = self._added.wait(timeout)
        self._added.clear()
        return fired

    def close(self) -> None:
        self._forget()
        if self._watch is not None:
            self._watch.unsubscribe()
        self._client.close()  # type: ignore[no-untyped-call]

    def migrate(self) -> None:
        """Nothing to create: a collection exists once it has a document."""

    def has_outbox(self) -> bool:
        return True

    def _where(self, field: str, op: str, value: Any) -> Any:
        return self._entries.where(filter=_filter(field, op, value))

    def _in_transaction(self, work: Callable[[Any], Any]) -> Any:
        return self._firestore.transactional(work)(self._client.transaction())

    def claim(self, limit: int, now: float, lease: float) -> list[Entry | Undecodable]:
        """Up to ``limit`` due pending entries, earliest due first, claimed until ``now +
        lease``. Optimistic, never a transaction: a query's read locks would outlive a
        killed relay and make the callers' commits time out ("Transaction lock timeout").
        Each entry's claim is conditional on the update time read, so of two relays that read
        the same entries each claims only those it updated first. A document that cannot be
        read back as an entry is marked failed by the same conditional write."""
        from google.api_core import exceptions as api  # noqa: PLC0415

        query = (
            self._where("state", "==", PENDING)
            .where(filter=_filter("next_attempt_at", "<=", now))
            .order_by("next_attempt_at")
            .limit(min(limit, _CHUNK))
        )
        snapshots = list(query.stream())
        if not snapshots:
            return []
        until = {"next_attempt_at": now + lease}
        decoded = [self._decode(snapshot) for snapshot in snapshots]
        changes = [
            (snapshot, until if isinstance(item, Entry) else self._failed(item.reason))
            for snapshot, item in zip(snapshots, decoded, strict=True)
        ]
        batch = self._client.batch()
        for snapshot, change in changes:
            batch.update(snapshot.reference, change, option=self._unchanged(snapshot))
        try:
            batch.commit()  # All or nothing: the usual case, one round trip.
            return decoded
        except (api.FailedPrecondition, api.NotFound):  # Another relay claimed some of them.
            mine: list[Entry | Undecodable] = []
            for (snapshot, change), item in zip(changes, decoded, strict=True):
                try:
                    snapshot.reference.update(change, option=self._unchanged(snapshot))
                except (api.FailedPrecondition, api.NotFound):
                    continue
                mine.append(item)
            return mine

    def _decode(self, snapshot: Any) -> Entry | Undecodable:
        """The entry of one document; its document id must be the one staging gives its name
        (else no mark would ever find it)."""
        item = decode(snapshot.to_dict() or {})
        if isinstance(item, Undecodable):
            return Undecodable(item.id or snapshot.id, item.reason)
        if doc_id(item.id) != snapshot.id:
            reason = "undecodable outbox entry: its document id is not the hash of its name"
            return Undecodable(item.id, reason)
        return item

    def _failed(self, reason: str) -> dict[str, Any]:
        """The update marking an undecodable document failed (its attempts may be garbage)."""
        return {"state": FAILED, "attempts": self._firestore.Increment(1), "last_error": reason}

    def _unchanged(self, snapshot: Any) -> Any:
        return self._client.write_option(last_update_time=snapshot.update_time)

    def _update_pending(
        self, changes: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]]
    ) -> None:
        """Apply each entry id's change to its document, if still pending (transactions of
        at most 500 writes)."""
        items = list(changes.items())
        for start in range(0, len(items), _CHUNK):
            chunk = dict(items[start : start + _CHUNK])

            def apply(tx: Any, chunk: dict[str, Any] = chunk) -> None:
                refs = [self._entries.document(doc_id(name)) for name in chunk]
                by_id = {ref.id: name for ref, name in zip(refs, chunk, strict=True)}
                for snapshot in tx.get_all(refs):
                    data = snapshot.to_dict() if snapshot.exists else None
                    if data is not None and data.get("state") == PENDING:
                        tx.update(snapshot.reference, chunk[by_id[snapshot.id]](data))

            self._in_transaction(apply)

    def mark_sent(self, ids: Sequence[str], now: float) -> None:
        self._update_pending(
            {
                name: lambda d: {
                    "state": SENT,
                    "sent_at": now,
                    "attempts": d["attempts"] + 1,
                    "last_error": None,
                }
                for name in ids
            }
        )

    def mark_failed(self, failures: Mapping[str, str]) -> None:
        def failed(reason: str) -> _Change:
            return lambda d: {"state": FAILED, "attempts": d["attempts"] + 1, "last_error": reason}

        self._update_pending({name: failed(reason) for name, reason in failures.items()})

    def retry_later(self, retries: Mapping[str, tuple[float, str]]) -> None:
        def later(at: float, error: str) -> _Change:
            return lambda d: {
                "next_attempt_at": at,
                "attempts": d["attempts"] + 1,
                "last_error": error,
            }

        self._update_pending({name: later(at, error) for name, (at, error) in retries.items()})

    def _each(self, query: Any, write: Callable[[Any, Any], None], limit: int | None = None) -> int:
        """``write(batch, snapshot)`` for every document ``query`` finds (at most ``limit``),
        500 per commit."""
        count = 0
        while limit is None or count < limit:
            chunk = _CHUNK if limit is None else min(_CHUNK, limit - count)
            snapshots = list(query.limit(chunk).stream())
            if not snapshots:
                return count
            batch = self._client.batch()
            for snapshot in snapshots:
                write(batch, snapshot)
            batch.commit()
            count += len(snapshots)
        return count

    def requeue_failed(self) -> int:
        return self._each(
            self._where("state", "==", FAILED),
            lambda batch, snap: batch.update(
                snap.reference, {"state": PENDING, "next_attempt_at": snap.get("created_at")}
            ),
        )

    def purge_sent(self, before: float, limit: int | None = None) -> int:
        query = self._where("state", "==", SENT).where(filter=_filter("sent_at", "<", before))
        return self._each(query, lambda batch, snap: batch.delete(snap.reference), limit)

    def _count(self, query: Any) -> int:
        return int(query.count().get()[0][0].value)

    def _oldest(self, state: str) -> float | None:
        query = self._where("state", "==", state).order_by("created_at").limit(1)
        for snapshot in query.stream():
            return float(snapshot.get("created_at"))
        return None

    def pending(self, now: float) -> tuple[int, float]:
        depth = self._count(self._where("state", "==", PENDING))
        oldest = self._oldest(PENDING)
        return depth, max(0.0, now - oldest) if oldest is not None else 0.0

    def status(self, now: float, failed_limit: int = 50) -> Status:
        depth, oldest_age = self.pending(now)
        pending = self._where("state", "==", PENDING)
        failed_query = self._where("state", "==", FAILED).order_by("created_at")
        failed = [
            Failed(s.get("id"), s.get("task_name"), int(s.get("attempts")), s.get("last_error"))
            for s in failed_query.limit(int(failed_limit)).stream()
        ]
        return Status(
            depth=depth,
            oldest_age=oldest_age,
            sent=self._count(self._where("state", "==", SENT)),
            failed=failed,
            retrying=self._count(pending.where(filter=_filter("attempts", ">", 0))),
            failed_total=self._count(self._where("state", "==", FAILED)),
        )


def _filter(field: str, op: str, value: Any) -> Any:
    from google.cloud.firestore_v1.base_query import FieldFilter  # noqa: PLC0415

    return FieldFilter(field, op, value)
