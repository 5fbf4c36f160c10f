"""Transactional enqueue: a task is created if and only if the caller's transaction commits.

``producer.enqueue("send_receipt", payload, key=f"order-{order_id}", transaction=conn)``
writes an outbox entry (table ``tasklease_outbox``) through ``conn``; the relay creates the
task under the entry's name after the commit (fast: Postgres LISTEN/NOTIFY; always: the
sweeper job and ``tasklease outbox relay``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasklease.lazy import lazy_exports

if TYPE_CHECKING:
    from tasklease.outbox.db import OutboxDB, Status, open_outbox
    from tasklease.outbox.ddl import script
    from tasklease.outbox.errors import NotInTransaction
    from tasklease.outbox.relay import Relay
    from tasklease.outbox.sweeper import SWEEP_JOB, RelayThread, register, relay_producer

_EXPORTS: dict[str, str] = {
    "NotInTransaction": "tasklease.outbox.errors",
    "OutboxDB": "tasklease.outbox.db",
    "Status": "tasklease.outbox.db",
    "open_outbox": "tasklease.outbox.db",
    "script": "tasklease.outbox.ddl",
    "Relay": "tasklease.outbox.relay",
    "RelayThread": "tasklease.outbox.sweeper",
    "SWEEP_JOB": "tasklease.outbox.sweeper",
    "register": "tasklease.outbox.sweeper",
    "relay_producer": "tasklease.outbox.sweeper",
}

__all__ = [
    "SWEEP_JOB",
    "NotInTransaction",
    "OutboxDB",
    "Relay",
    "RelayThread",
    "Status",
    "open_outbox",
    "register",
    "relay_producer",
    "script",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
