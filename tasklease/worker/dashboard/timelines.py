"""The run page's attempt timeline: the run and the runs its replay links name, read (two
reads at most) and drawn. The rule is :mod:`tasklease.worker.core.timeline`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tasklease.worker.core.records import RunRecord
from tasklease.worker.core.timeline import timeline
from tasklease.worker.dashboard import charts
from tasklease.worker.stores.base.store import LeaseStore


def run_timeline(store: LeaseStore, record: RunRecord, now: datetime) -> dict[str, Any]:
    """The run page's timeline: the run's latest attempt and the runs its replay links name
    (two reads at most), drawn."""
    replay_of = store.get(record.replay_of) if record.replay_of else None
    replayed_as = store.get(record.replayed_as) if record.replayed_as else None
    line = timeline(record, now, replay_of=replay_of, replayed_as=replayed_as)
    title = f"Attempt timeline of run {record.run_id[:16]}"
    chart = charts.responsive(
        charts.timeline_chart(line, title=title, width=1080),
        charts.timeline_chart(line, title=title, width=340),
    )
    return {"chart": chart, "notes": line.notes, "line": line}
