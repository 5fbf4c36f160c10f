"""The summary page: each handler's last hour from the store, in pictures. Its reads are
bounded; the rule is :mod:`tasklease.worker.core.activity`, the drawing :mod:`.charts`."""

from __future__ import annotations

from datetime import datetime

import flask
from markupsafe import Markup

from tasklease.worker.core.activity import WINDOW, Activity, summarize, window_start
from tasklease.worker.core.deliveries import TallyRow, delivery_minutes
from tasklease.worker.core.queries import MAX_PAGE, RunFilter
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.dashboard import charts
from tasklease.worker.dashboard.views import render
from tasklease.worker.operate.operations import Operations
from tasklease.worker.stores.base.tally import DeliveryTally

# At most this many runs of the last hour are read for one page view (four store pages).
MAX_RUNS = 2000
# And at most this many dead letters and stuck runs, of any age, to count per handler.
MAX_COUNTED = 500


def read_window(
    operations: Operations, now: datetime, limit: int = MAX_RUNS
) -> tuple[list[RunRecord], datetime | None]:
    """The runs claimed in the window, newest first, up to ``limit``; and, when the limit
    cut the read short, the claim time of the oldest run read (else None)."""
    filters = RunFilter(newer_than=window_start(now))
    runs: list[RunRecord] = []
    cursor = None
    for _ in range(-(-limit // MAX_PAGE) + 1):
        page = operations.list_runs(filters, min(MAX_PAGE, limit - len(runs)), cursor)
        runs.extend(page.runs)
        cursor = page.cursor
        if cursor is None:
            return runs, None
        if len(runs) >= limit:
            break
    return runs, (runs[-1].claimed_at if runs else now)


def read_counted(operations: Operations, filters: RunFilter) -> tuple[list[RunRecord], bool]:
    """Up to :data:`MAX_COUNTED` runs matching ``filters``, and whether there are more."""
    page = operations.list_runs(filters, min(MAX_COUNTED, MAX_PAGE))
    return page.runs, page.cursor is not None


def activity(operations: Operations, now: datetime) -> tuple[Activity, dict[str, bool]]:
    """The summary at ``now``, and which of its reads stopped at their limit."""
    runs, oldest = read_window(operations, now, MAX_RUNS)
    dead, more_dead = read_counted(operations, RunFilter(status=RunStatus.FAILED))
    stuck, more_stuck = read_counted(operations, RunFilter(stuck_at=now))
    summary = summarize(runs, now, oldest_read=oldest, dead_letters=dead, stuck=stuck)
    return summary, {"runs": oldest is not None, "dead": more_dead, "stuck": more_stuck}


def tally_rows(operations: Operations, start: datetime) -> list[TallyRow] | None:
    """The store's delivery counts since ``start``; None for a store without the tally."""
    store = operations.store
    if not isinstance(store, DeliveryTally):
        return None
    counts = store.delivery_counts(start)
    return [
        (minute, key.handler, key.outcome, n)
        for minute, keyed in counts.items()
        for key, n in keyed.items()
    ]


class SummaryView:
    """The ``/summary`` page over one :class:`Operations`."""

    def __init__(self, operations: Operations) -> None:
        self.operations = operations

    def summary(self) -> flask.Response:
        now = self.operations.clock()
        summary, cut = activity(self.operations, now)
        handler = flask.request.args.get("handler") or None
        shown = [h for h in summary.handlers if handler is None or h.handler == handler]
        total = summary.total
        title = "All handlers: runs per minute, last hour"
        rows = tally_rows(self.operations, summary.start)
        cards = [
            {
                "activity": h,
                "chart": charts.minutes_chart(
                    h, summary, title=f"{h.handler}: runs per minute, last hour", height=130
                ),  # A card is about as wide on a phone as on a desktop: one drawing.
                "deliveries": _card_deliveries(rows, summary.start, h.handler),
                "p50": charts.seconds_text(h.p50),
                "p99": charts.seconds_text(h.p99),
            }
            for h in shown
        ]
        return render(
            "summary.html",
            summary=summary,
            total=total,
            total_chart=charts.responsive(
                charts.minutes_chart(total, summary, title=title, width=1080, height=220),
                charts.minutes_chart(total, summary, title=title, width=360, height=150),
            ),
            cards=cards,
            legend=charts.legend(),
            deliveries=None if rows is None else _deliveries(rows, summary.start, handler),
            outcome_legend=charts.outcome_legend(),
            handler=handler,
            cut=cut,
            limits={"runs": MAX_RUNS, "counted": MAX_COUNTED},
            window_minutes=int(WINDOW.total_seconds() // 60),
            stuck_count=total.stuck,
        )


def _deliveries(rows: list[TallyRow], start: datetime, handler: str | None) -> dict[str, object]:
    """The page's deliveries chart (both drawings) and its totals by outcome."""
    minutes = delivery_minutes(rows, start, handler=handler)
    title = f"{minutes.handler}: deliveries per minute by outcome, last hour"
    return {
        "chart": charts.responsive(
            charts.deliveries_chart(minutes, title=title, width=1080, height=220),
            charts.deliveries_chart(minutes, title=title, width=360, height=150),
        ),
        "total": minutes.total,
    }


def _card_deliveries(rows: list[TallyRow] | None, start: datetime, handler: str) -> Markup | None:
    """A handler card's deliveries chart; None without a tally or without counts."""
    if rows is None:
        return None
    minutes = delivery_minutes(rows, start, handler=handler)
    if not minutes.total:
        return None
    title = f"{handler}: deliveries per minute by outcome, last hour"
    return charts.deliveries_chart(minutes, title=title, height=110)
