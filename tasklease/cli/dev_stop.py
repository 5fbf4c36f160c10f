"""How ``tasklease dev`` stops on Ctrl-C: it says which executions it interrupts and that
their leases will lapse (then a retry runs them again), and stops the worker without
gunicorn's own alarm ("was sent SIGKILL! Perhaps out of memory?") for a handler still
running when it is stopped."""

from __future__ import annotations

from datetime import datetime

from tasklease.errors import StoreUnavailable
from tasklease.worker.core.queries import RunFilter
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.operate.operations import Operations
from tasklease.worker.stores import store_from_url


def running(store_url: str) -> tuple[list[RunRecord], datetime]:
    """The runs whose attempt holds a live lease now (executing, as far as the store
    knows), and the time it was read."""
    store = store_from_url(store_url)
    try:
        operations = Operations(store)
        now = operations.clock()
        page = operations.list_runs(RunFilter(status=RunStatus.IN_PROGRESS), 100)
        return [r for r in page.runs if r.lease_expires > now], now
    except StoreUnavailable:
        return [], datetime.now()
    finally:
        store.close()


def interrupted_message(records: list[RunRecord], now: datetime) -> str:
    """What Ctrl-C stops, for the terminal."""
    count = f"{len(records)} execution{'s' if len(records) != 1 else ''}"
    lines = [f"stopping: {count} interrupted, the worker stopped mid-run:"]
    for record in records:
        left = max(0, int((record.lease_expires - now).total_seconds()))
        lines.append(
            f"  run {record.run_id[:12]} ({record.kind} {record.handler}, attempt "
            f"{record.attempts}, fencing token {record.fencing_token}): its lease lapses at "
            f"{record.lease_expires:%H:%M:%S} UTC (in {left} s); then a retry runs it again"
        )
    lines.append("  To hand one back at once next time: tasklease runs release RUN_ID --force")
    return "\n".join(lines)
