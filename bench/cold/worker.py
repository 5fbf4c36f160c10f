"""The same handler as a tasklease worker on a MemoryStore, built at import as a user's app is."""

from __future__ import annotations

from typing import Any

from tasklease import MemoryStore, Router, TaskContext, create_app

router = Router()


@router.task("noop")
def noop(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    return {"ok": True, "n": len(payload)}


app = create_app(router, store=MemoryStore(), auth="none")
