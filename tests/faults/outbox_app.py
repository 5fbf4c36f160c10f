"""The worker of the outbox proofs: ``record`` counts executions; the outbox sweeper job."""

from __future__ import annotations

import os
from typing import Any

from tasklease import outbox
from tasklease.demo.ledger import Ledger
from tasklease.worker import Router, TaskContext

router = Router()


@router.task("record")
def record(payload: Any, ctx: TaskContext) -> None:
    Ledger(os.environ["TEST_LEDGER"]).record("record", str(payload["n"]), ctx)


outbox.register(router)  # TASKLEASE_OUTBOX_URL
