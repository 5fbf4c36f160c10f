"""The retry of a store write made after the handler ran: a finish (complete, fail, release,
skip, yield) or the release of the lock the execution held.

The handler's effects already happened, so recording how it ended is worth a short wait; a
retried write that finds its own earlier try landed counts as done (the store recognises it
by attempt id).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tasklease.errors import StoreUnavailable

# Pauses before each retry of a write the store refused as unavailable.
FINISH_RETRY_PAUSES = (0.05, 0.2, 0.5)

T = TypeVar("T")


def retry_while_unavailable(
    write: Callable[[], T], sleep: Callable[[float], None] = time.sleep
) -> T:
    """``write()``, tried again after each of :data:`FINISH_RETRY_PAUSES` (waited with
    ``sleep``) while it raises :class:`StoreUnavailable`; the last try's error propagates."""
    for pause in FINISH_RETRY_PAUSES:
        try:
            return write()
        except StoreUnavailable:
            sleep(pause)
    return write()
