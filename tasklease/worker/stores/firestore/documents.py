"""The Firestore store's run documents: its client's calls on one collection, bounded, their
errors as :class:`StoreUnavailable`, and the three conditional writes the shared claim
(:mod:`tasklease.worker.stores.base.conditional_claims`) is built on.

Single-document preconditions, which Firestore evaluates atomically: ``create()`` (the
document must not exist) and ``update()`` conditional on the ``update_time`` read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from google.api_core import exceptions as api
from google.api_core import retry as retries
from google.cloud import firestore

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import RunRecord
from tasklease.worker.stores.base.conditional_claims import (
    ConditionalWrites,
    Inserted,
    MayHaveLanded,
    Versioned,
)
from tasklease.worker.stores.firestore.codec import decode_run, encode_run

__all__ = ["UNCERTAIN", "FirestoreRuns", "guard"]

# Errors the client retries by itself within one call (a retried write may then conflict with
# its own first try, which the shared claim recognises by the stored attempt id).
_TRANSIENT = retries.if_exception_type(
    api.ServiceUnavailable, api.DeadlineExceeded, api.InternalServerError, api.ResourceExhausted
)
# Errors after which a write may have landed: the server may have committed it before the
# call failed (RetryError: the client's retries ran out of time, the last one such an error).
UNCERTAIN = (
    api.DeadlineExceeded,
    api.ServiceUnavailable,
    api.InternalServerError,
    api.Unknown,
    api.Cancelled,
    api.RetryError,
)


@contextmanager
def guard(action: str) -> Iterator[None]:
    """Turn Firestore and transport errors into :class:`StoreUnavailable`."""
    try:
        yield
    except StoreUnavailable:
        raise
    except (api.GoogleAPIError, ValueError, OSError) as exc:
        # ValueError: @transactional gives up after its retries on ABORTED.
        raise StoreUnavailable(f"Firestore store: could not {action}: {exc}") from exc


class FirestoreRuns(ConditionalWrites[datetime]):
    """The documents of ``collection`` through ``client`` (the store's, made per process),
    each call bounded by ``call_timeout``, the client's own retries included."""

    def __init__(
        self, client: Callable[[], firestore.Client], collection: str, call_timeout: float
    ) -> None:
        self._client = client
        self.collection = collection
        self.call_timeout = call_timeout
        self._retry = retries.Retry(
            predicate=_TRANSIENT, initial=0.1, maximum=2.0, multiplier=2.0, timeout=call_timeout
        )

    @property
    def client(self) -> firestore.Client:
        return self._client()

    @property
    def call_options(self) -> dict[str, Any]:
        """The retry and timeout of one call."""
        return {"retry": self._retry, "timeout": self.call_timeout}

    def document(self, run_id: str) -> Any:
        return self.client.collection(self.collection).document(run_id)

    def get(self, run_id: str) -> RunRecord | None:
        with guard("read a run"):
            snapshot = self.document(run_id).get(**self.call_options)
        return decode_run(run_id, snapshot.to_dict()) if snapshot.exists else None

    # --- The conditional writes -------------------------------------------------------

    def insert_if_absent(
        self, record: RunRecord
    ) -> Inserted[datetime] | Versioned[datetime] | None:
        try:
            written = self.document(record.run_id).create(encode_run(record), **self.call_options)
        except api.Aborted:
            return None  # Contention: a Conflict subclass, but nothing was written.
        except api.Conflict as exc:  # AlreadyExists, or a conflict with our own first try,
            # retried by the client: the stored record decides, even our landed claim.
            raise MayHaveLanded(
                f"Firestore store: could not claim a run: {exc}", exc, ours_only=False
            ) from exc
        except UNCERTAIN as exc:
            raise MayHaveLanded(f"Firestore store: could not claim a run: {exc}", exc) from exc
        return Inserted(written.update_time)

    def read_versioned(self, run_id: str) -> Versioned[datetime] | None:
        with guard("read a run"):
            snapshot = self.document(run_id).get(**self.call_options)
        if not snapshot.exists:
            return None
        return Versioned(decode_run(run_id, snapshot.to_dict()), snapshot.update_time)

    def write_if_version(
        self, before: Versioned[datetime], record: RunRecord, *, finishing: bool = False
    ) -> datetime | None:
        """Write ``record`` if the document is still at ``before``'s update time."""
        option = self.client.write_option(last_update_time=before.version)
        try:
            written = self.document(record.run_id).update(
                encode_run(record), option=option, **self.call_options
            )
        except (api.FailedPrecondition, api.NotFound, api.Aborted):
            return None
        except UNCERTAIN as exc:
            raise MayHaveLanded(f"Firestore store: could not change a run: {exc}", exc) from exc
        result: datetime = written.update_time
        return result
