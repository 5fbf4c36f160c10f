"""The outbox page: what waits to be relayed, for how long, and what Cloud Tasks refused.

Shown when an outbox is configured: ``outbox=`` (``tasklease dashboard --outbox URL``), else
``TASKLEASE_OUTBOX_URL``, else the store's own SQLite or Spanner database when it has the
``tasklease_outbox`` table. Each view opens the outbox, reads its status (bounded: counts
and at most :data:`FAILED_SHOWN` failed entries) and closes it. A failed entry's reason is
text from Cloud Tasks or the relay and may echo the task's own contents: the template
escapes it like every other value.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import flask

from tasklease.outbox.locate import ENV_OUTBOX_URL, outbox_url, sqlite_has_outbox
from tasklease.plumbing.url_secrets import scrubbed, shown_url
from tasklease.worker.dashboard.charts import seconds_text
from tasklease.worker.dashboard.csrf import Csrf
from tasklease.worker.dashboard.views import render
from tasklease.worker.stores.base.store import LeaseStore

if TYPE_CHECKING:
    from tasklease.outbox.db import Status

_log = logging.getLogger("tasklease.dashboard")

FAILED_SHOWN = 50
REASON_CHARS = 2000  # A reason longer than this is cut (the CLI's status shows it whole).


def locate(outbox: str | None, store: LeaseStore) -> str | None:
    """``outbox`` ("": none), else ``TASKLEASE_OUTBOX_URL``, else the SQLite store's file
    or the Spanner store's database when it has the table."""
    if outbox is not None:
        return outbox or None
    url = outbox_url(None)  # TASKLEASE_OUTBOX_URL
    if url is None:
        path = getattr(store, "path", None)  # SqliteStore's file.
        if isinstance(path, Path) and sqlite_has_outbox(path):
            url = f"sqlite:///{path}"
        database = getattr(store, "database_path", None)  # SpannerStore's database.
        if isinstance(database, str) and database.startswith("projects/"):
            url = outbox_url(f"spanner://{database}")
    return url


class OutboxView:
    """``GET /outbox`` and ``POST /outbox/requeue`` over the outbox at ``url`` (None: none)."""

    def __init__(
        self,
        url: str | None,
        *,
        csrf: Csrf,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.csrf = csrf
        self.clock = clock

    @property
    def configured(self) -> bool:
        return self.url is not None

    def page(self, notice: str | None = None, status: int = 200) -> flask.Response:
        if self.url is None:
            return render("outbox.html", 404, outbox=None, env_name=ENV_OUTBOX_URL)
        from tasklease.outbox.db import open_outbox  # noqa: PLC0415 - only when configured.

        try:
            db = open_outbox(self.url)
            try:
                report = db.status(self.clock(), failed_limit=FAILED_SHOWN)
            finally:
                db.close()
        except Exception as exc:  # The database's own error: unreachable, no table yet.
            _log.warning(
                "outbox %s unavailable: %s", shown_url(self.url), scrubbed(str(exc), self.url)
            )
            return render(
                "denied.html", 503, reason=f"The outbox is unavailable: {type(exc).__name__}."
            )
        return render(
            "outbox.html",
            status,
            notice=notice,
            outbox=_context(report),
            where=shown_url(self.url),
            csrf=self.csrf.page_token(),
            failed_shown=FAILED_SHOWN,
        )

    def requeue(self) -> flask.Response:
        """Failed entries back to pending, after the operator fixed their cause."""
        if self.url is None:
            return self.page()
        from tasklease.outbox.db import open_outbox  # noqa: PLC0415

        db = open_outbox(self.url)
        try:
            count = db.requeue_failed()
        finally:
            db.close()
        _log.warning(
            "operator %s requeued %d failed outbox entries",
            flask.g.get("operator") or "(local)",
            count,
        )
        return self.page(f"Requeued {count} failed entries: the relay sends them again.")


def _context(report: Status) -> dict[str, Any]:
    return {
        "depth": report.depth,
        "oldest_age": seconds_text(report.oldest_age) if report.depth else "—",
        "retrying": report.retrying,
        "sent": report.sent,
        "failed_total": report.failed_total,
        "failed": [
            {
                "id": entry.id,
                "task_name": entry.task_name,
                "attempts": entry.attempts,
                "reason": _cut(entry.reason),
            }
            for entry in report.failed
        ],
    }


def _cut(reason: str) -> str:
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + " …"
