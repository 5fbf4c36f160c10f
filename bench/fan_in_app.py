"""The fan-in benchmark's worker: ``TASKLEASE_ROUTER=bench.fan_in_app:router``.

``fan_parent`` fans out ``count`` ``leaf`` children joined by ``joined``, which writes the
moment it ran and what it was given to ``BENCH_FAN_IN_OUT`` (a JSON file).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tasklease.worker import Router, TaskContext

router = Router()


@router.task("fan_parent")
def fan_parent(payload: dict[str, Any], ctx: TaskContext) -> int:
    items = [(f"leaf-{n:06d}", n) for n in range(int(payload["count"]))]
    ctx.fan_out("leaf", items, then="joined")
    return len(items)


@router.task("leaf")
def leaf(payload: int, ctx: TaskContext) -> int:
    return payload * 2


@router.task("joined")
def joined(payload: dict[str, Any], ctx: TaskContext) -> None:
    out = Path(os.environ["BENCH_FAN_IN_OUT"])
    record = {"at": time.time(), "summary": payload["summary"], "inline": len(payload["results"])}
    out.write_text(json.dumps(record))
