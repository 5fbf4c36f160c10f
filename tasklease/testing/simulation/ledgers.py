"""The ledger a simulated transactional handler writes its effect to, inside its own store
transaction, and the checker reads back on its own: the rows that committed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tasklease.worker.stores.base.store import LeaseStore

__all__ = ["Ledger", "LedgerRow", "ledger_for"]


@dataclass(frozen=True)
class LedgerRow:
    """One committed effect: the run and attempt that wrote it, and what it was."""

    run_id: str
    attempt_id: str
    effect: str


class Ledger(Protocol):
    """A table in the store's database, written in the handler's transaction."""

    def prepare(self) -> None: ...
    def write(self, transaction: Any, row: LedgerRow) -> None: ...
    def rows(self) -> list[LedgerRow]: ...
    def close(self) -> None: ...


def ledger_for(store: LeaseStore) -> Ledger | None:
    """The ledger for ``store``'s database; None: none yet for this kind of store."""
    return None
