"""Where the Spanner store still imports the orphan claims from: they live in
:mod:`tasklease.worker.stores.base.orphans`, shared by every store that claims by a
conditional write."""

from tasklease.worker.stores.base.orphans import OrphanClaims, orphan_released

__all__ = ["OrphanClaims", "orphan_released"]
