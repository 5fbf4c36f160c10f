"""What every store shares: the store protocols, the codec, handler transactions, the tally.

The run protocol's names are offered here too, where a store of one's own has imported
them from (``from tasklease.worker.stores.base import Change, LeaseStore``).
"""

from tasklease.worker.stores.base.store import (
    Change,
    LeaseStore,
    LockChange,
    Moment,
    RunReader,
    Update,
    resolve,
)

__all__ = ["Change", "LeaseStore", "LockChange", "Moment", "RunReader", "Update", "resolve"]
