"""``ctx.transaction`` on Spanner and Firestore: the client's ``Transaction``, minus the means
to end it (:mod:`.handler_transaction`).

Both clients' transaction objects have a public way to commit: Spanner's ``commit()`` and
``rollback()``, and Firestore's ``commit()`` and ``with tx:`` (its ``Transaction`` is a
``WriteBatch``, whose commit sends the writes buffered so far outside the transaction). Any
of them would keep the handler's writes without the run's completion record, or leave the
record nothing to be written in. The wrapper refuses them; every other attribute is the
transaction's, so reads, DML, mutations and the outbox's staging go through unchanged.
"""

from __future__ import annotations

from typing import Any

from tasklease.worker.stores.base.handler_transaction import refused

__all__ = ["GoogleTransaction"]

_ENDING = frozenset(("commit", "rollback", "_commit", "_rollback"))


class GoogleTransaction:
    """The handler's view of a Spanner or Firestore ``Transaction`` (``wrapped``)."""

    __slots__ = ("wrapped",)

    def __init__(self, wrapped: Any) -> None:
        object.__setattr__(self, "wrapped", wrapped)

    def __enter__(self) -> None:
        raise refused("its use as a context manager (it commits on exit)")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raised
        return None

    def __getattr__(self, name: str) -> Any:
        if name in _ENDING:
            raise refused(f"{name.lstrip('_')}()")
        return getattr(self.wrapped, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.wrapped, name, value)
