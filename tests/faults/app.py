"""The worker the fault scenarios serve under gunicorn: ``TASKLEASE_ROUTER=tests.faults.app:app``.

Handlers take their timing from the payload and write to the fenced :class:`Downstream` named
by ``TASKLEASE_FAULTS_DOWNSTREAM``. The environment also sets this process's clock skew
(``TASKLEASE_FAULTS_CLOCK_SKEW``, seconds) and the SQLite store's busy timeout
(``TASKLEASE_FAULTS_BUSY_TIMEOUT``, seconds), which no store URL can express.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import flask

from tasklease import protocol
from tasklease.worker import LeaseLost, Router, TaskContext, create_app
from tasklease.worker.core import constants as c
from tasklease.worker.runtime.clock import utc_now
from tasklease.worker.stores import LeaseStore, SqliteStore, store_from_url
from tests.faults import ledger
from tests.faults.downstream import REFUSED, Downstream

ENV_DOWNSTREAM = "TASKLEASE_FAULTS_DOWNSTREAM"
ENV_CLOCK_SKEW = "TASKLEASE_FAULTS_CLOCK_SKEW"
ENV_BUSY_TIMEOUT = "TASKLEASE_FAULTS_BUSY_TIMEOUT"
ENV_REVISION = "TASKLEASE_FAULTS_REVISION"

router = Router()
_downstream: Downstream | None = None


def downstream() -> Downstream:
    global _downstream  # noqa: PLW0603 - one per process, opened on first use.
    if _downstream is None:
        _downstream = Downstream(os.environ[ENV_DOWNSTREAM])
    return _downstream


def _work(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Record the entry, sleep ``sleep`` s (or until the time ``until``) in ``steps`` steps,
    checking the lease between them if ``check``; write the fenced effect, sleep ``after`` s,
    record the end."""
    key = str(payload["key"])
    ledger = downstream()
    ledger.started(key, ctx)
    verdict, past_lease, live_until = "raised", 0, time.time()
    try:
        steps = max(1, int(payload.get("steps", 1)))
        duration = float(payload.get("sleep", 0))
        if "until" in payload:  # A wall-clock time: its retries after it do not wait.
            duration = max(0.0, float(payload["until"]) - time.time())
        for _ in range(steps):
            time.sleep(duration / steps)
            if payload.get("check"):
                # Read before the check, by this process's own clock as the worker sees it:
                # past the lease, another attempt may already have taken the run over.
                now = _clock()
                ctx.check_lease()
                live_until = time.time()
                if now >= ctx.lease_expires:
                    past_lease += 1
        verdict = ledger.write(key, ctx)
        if verdict == REFUSED:
            raise LeaseLost(f"downstream refused fencing token {ctx.fencing_token} for {key}")
        live_until = time.time()
        time.sleep(float(payload.get("after", 0)))
    except LeaseLost:
        verdict = "lost" if verdict == "raised" else verdict
        raise
    finally:
        ledger.ended(ctx, verdict, past_lease, live_until)
    return {"verdict": verdict, "pid": os.getpid(), "token": ctx.fencing_token}


@router.task("work", lease=timedelta(seconds=2))
def work(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """The scenarios' handler, with a 2 s lease (renewed every 2/3 s while it runs)."""
    return _work(payload, ctx)


@router.task("brief", lease=timedelta(seconds=1))
def brief(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """The same handler with the shortest lease the router allows."""
    return _work(payload, ctx)


@router.task("steps", lease=timedelta(seconds=2))
def five_steps(payload: dict[str, Any], ctx: TaskContext) -> list[bool]:
    """Five durable steps, each applying an effect downstream under its step key."""
    from tests.faults.steps_ledger import StepsLedger  # noqa: PLC0415 - this scenario only.

    ledger = StepsLedger(Path(os.environ[ENV_DOWNSTREAM]).with_name("steps.db"))
    pause = float(payload.get("sleep", 0.05))

    def effect(name: str) -> bool:
        ledger.called(ctx.run_id, name, ctx.attempt_id)
        time.sleep(pause)
        return ledger.apply(ctx.run_id, name, ctx.attempt_id, ctx.step_key(name))

    return [ctx.step(f"step-{i}", effect, f"step-{i}") for i in range(5)]


@router.task("chain", lease=timedelta(seconds=2))
def chain(payload: dict[str, Any], ctx: TaskContext) -> dict[str, int] | None:
    """A continuation chain of ``length`` deliveries, one durable step each."""
    from tests.faults.steps_ledger import StepsLedger  # noqa: PLC0415 - this scenario only.

    ledger = StepsLedger(Path(os.environ[ENV_DOWNSTREAM]).with_name("steps.db"))
    i = int((ctx.state or {"i": 0})["i"])

    def effect(name: str) -> bool:
        ledger.called(ctx.run_id, name, ctx.attempt_id)
        return ledger.apply(ctx.run_id, name, ctx.attempt_id, ctx.step_key(name))

    ctx.step(f"segment-{i}", effect, f"segment-{i}")
    if i + 1 < int(payload["length"]):
        ctx.continue_later({"i": i + 1})
        return None
    return {"done": i}


@router.task("fan_parent", lease=timedelta(seconds=5))
def fan_parent(payload: dict[str, Any], ctx: TaskContext) -> int:
    """Fans out ``count`` ``work`` children, joined by ``fan_then``."""
    items = [(f"{payload['prefix']}-{n:04d}", {"key": f"{payload['prefix']}-{n:04d}"})
             for n in range(int(payload["count"]))]  # fmt: skip
    ctx.fan_out("work", items, then="fan_then")
    return len(items)


@router.task("fan_then", lease=timedelta(seconds=5))
def fan_then(payload: dict[str, Any], ctx: TaskContext) -> int:
    """Appends each execution, with the results it was given, to ``fan_in.jsonl``."""
    import json  # noqa: PLC0415 - this scenario only.

    line = json.dumps({"attempt": ctx.attempt_id, "pid": os.getpid(), "payload": payload})
    path = Path(os.environ[ENV_DOWNSTREAM]).with_name("fan_in.jsonl")
    with path.open("a") as out:  # One write of one line: appends do not interleave.
        out.write(line + "\n")
    return len(payload["results"])


def _note_wait(key: str, phase: str, ctx: TaskContext, value: Any = None) -> str:
    """Append what a waiting run did (``asked`` before its wait, ``acted`` after it) to
    ``waits.jsonl``: one write of one line, so appends do not interleave."""
    import json  # noqa: PLC0415 - this scenario only.

    line = json.dumps(
        {"key": key, "phase": phase, "run": ctx.run_id, "attempt": ctx.attempt_id, "value": value}
    )
    path = Path(os.environ[ENV_DOWNSTREAM]).with_name("waits.jsonl")
    with path.open("a") as out:
        out.write(line + "\n")
    return phase


@router.task("wait_work", lease=timedelta(seconds=5))
def wait_work(payload: dict[str, Any], ctx: TaskContext) -> Any:
    """Asks (a step), waits for the signal ``go``, then acts on its value (a step)."""
    key = str(payload["key"])
    ctx.step("asked", lambda: _note_wait(key, "asked", ctx))
    value = ctx.wait_for("go", timeout=float(payload.get("timeout", 3600)))
    ctx.step("acted", lambda: _note_wait(key, "acted", ctx, value))
    return value


ledger.register(router)  # The crash-after-effect scenario's handlers (test_transactional.py).


def skewed_clock() -> Any:
    skew = timedelta(seconds=float(os.environ.get(ENV_CLOCK_SKEW, "0")))
    if not skew:
        return utc_now

    def now() -> datetime:
        return utc_now() + skew

    return now


def build_store() -> LeaseStore:
    url = os.environ.get(protocol.ENV_STORE, c.DEFAULT_STORE_URL)
    busy = os.environ.get(ENV_BUSY_TIMEOUT)
    if busy and url.startswith("sqlite://"):
        path = url.partition("://")[2]
        return SqliteStore(
            path[1:] if path.startswith("/") else path,
            busy_timeout=timedelta(seconds=float(busy)),
        )
    return store_from_url(url)


_clock = skewed_clock()


def build_app() -> flask.Flask:
    return create_app(router, store=build_store(), clock=_clock)


def __getattr__(name: str) -> flask.Flask:
    # Built on first access (by tasklease.worker.wsgi in the gunicorn worker), never at import.
    if name == "app":
        built = build_app()
        globals()["app"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
