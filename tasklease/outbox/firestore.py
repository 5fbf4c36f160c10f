"""The outbox in Firestore: entries staged through the caller's ``Transaction``, and the relay's
side (claim, mark, report) over the collection ``tasklease_outbox``.

An entry is a document named by a hash of the task's full name (hashed IDs spread the load,
and the name has slashes), written with ``transaction.create``: the commit fails rather than
overwrite an entry of the same name. Before that, one read outside the transaction (it takes
no lock) skips a name already staged by an earlier commit (``staged=False``, as the SQL
outboxes' ``ON CONFLICT DO NOTHING``); a second enqueue of a name within one transaction is
skipped too. Two transactions staging a new name at once: the later commit fails with
``AlreadyExists``, never a second entry.

The relay claims a batch with a query of due pending entries, ordered by due time (an
entry's commit time until it is backed off or claimed), outside any transaction (a query's
read locks in one would outlive a killed relay and time out the callers' commits): each entry
is pushed ``lease`` seconds ahead on condition of the update time read, so racing relays
claim disjoint sets. A following relay is woken by a listener on the newest pending entry
(the fast path). Its marks are transactions
that change only entries still pending. Production needs composite indexes on
(state, next_attempt_at), (state, created_at) and (state, attempts); the emulator needs none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from tasklease.outbox.entries import PENDING, TABLE, Entry
from tasklease.outbox.errors import NotInTransaction

COLLECTION = TABLE
_CHUNK = 500  # Writes per commit (Firestore's limit).


def doc_id(name: str) -> str:
    """The document ID of the entry for the task named ``name`` (its full resource name)."""
    return hashlib.sha256(name.encode()).hexdigest()


def stage(tx: Any, entries: Sequence[Entry], collection: str = COLLECTION) -> list[bool]:
    """``transaction.create`` one document per new entry; True for each that is new."""
    if not getattr(tx, "in_progress", False):
        raise NotInTransaction(
            "the Firestore Transaction is not in progress: stage inside a function decorated "
            "with @firestore.transactional"
        )
    client = tx._client  # noqa: SLF001 - a Transaction names its client only privately.
    refs = [client.collection(collection).document(doc_id(entry.id)) for entry in entries]
    # Outside the transaction: a read inside it would lock, and fails after its writes.
    found = {snap.id for snap in client.get_all(refs, field_paths=["state"]) if snap.exists}
    # Names this attempt of the transaction writes already. Not a set kept on ``tx``:
    # @firestore.transactional re-runs the function on the same object after an aborted
    # commit, and the re-run must stage its entries again (its writes start empty).
    written = {pb.update.name for pb in getattr(tx, "_write_pbs", ())} - {""}
    new: list[bool] = []
    for entry, ref in zip(entries, refs, strict=True):
        # The full name a write carries; a reference's public ``path`` is the relative one.
        full_name = ref._document_path  # noqa: SLF001 - see the comment above.
        if ref.id in found or full_name in written:
            new.append(False)
            continue
        tx.create(ref, _document(entry))
        written.add(full_name)
        new.append(True)
    return new


def _document(entry: Entry) -> dict[str, Any]:
    return {**entry.row(), "state": PENDING, "attempts": 0, "last_error": None, "sent_at": None}
