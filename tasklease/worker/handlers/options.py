"""The options every handler kind takes, written once: :meth:`Router.task
<tasklease.worker.Router.task>`, :meth:`~tasklease.worker.Router.scheduled` and
:meth:`~tasklease.worker.Router.proxy_job` take them as ``**options``, beside their own."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TypedDict

__all__ = ["HandlerOptions", "JobOptions"]


class HandlerOptions(TypedDict, total=False):
    """The options of every handler (:meth:`~tasklease.worker.Router.task`,
    :meth:`~tasklease.worker.Router.scheduled`, :meth:`~tasklease.worker.Router.proxy_job`),
    by keyword, all optional; an unknown one is a TypeError naming the known ones."""

    lease: timedelta
    """How long one attempt holds the run before another may take it over (default 5 min).
    The worker renews it about every ``lease / 3`` while the handler runs, so it bounds how
    long a crashed attempt blocks retries, not how long a handler may run."""

    retention: timedelta
    """How long the run record is kept after the claim (default 7 days); it must outlive the
    queue's retry window (Cloud Tasks remembers task names for up to 24 hours)."""

    max_attempts: int | None
    """After this many claims of one run, the run is recorded as failed without running again
    (a poison-message guard independent of the queue's settings). Default: no limit."""

    allowed_service_accounts: Iterable[str] | None
    """The service accounts whose OIDC tokens this handler takes, instead of the app-wide
    setting."""

    audience: str | None
    """The OIDC token audience of this handler, instead of the app-wide one."""


class JobOptions(HandlerOptions, total=False):
    """The options of every scheduled handler (:meth:`~tasklease.worker.Router.scheduled`,
    :meth:`~tasklease.worker.Router.proxy_job`): :class:`HandlerOptions` and
    ``manual_run_margin``."""

    manual_run_margin: timedelta | None
    """A delivery whose schedule time lies more than this after its arrival is a manual run
    (``gcloud scheduler jobs run`` or the Console's "Force run" send the *next* slot's time,
    well before it). Default (None): the router's, itself 60 s by default; at least
    ``MAX_CLOCK_SKEW``. The manual run runs as a run of its own, derived from that slot, so
    its retries stay one run, whenever they arrive (the store's record of it tells them from
    the slot's own delivery), and the slot's own delivery still runs when it comes. Keep it
    well below the job's interval: for a job firing every minute, a manual run started
    within the margin before the next slot counts as that slot's run."""
