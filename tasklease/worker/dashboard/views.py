"""The dashboard's pages: runs with filters, a run's detail, stuck runs, and the release,
replay and cancel forms, each answered with a server-rendered template."""

from __future__ import annotations

import json
import logging
from typing import Any

import flask

from tasklease.errors import StoreUnavailable
from tasklease.jobs import Job
from tasklease.producer.errors import EnqueueError
from tasklease.worker.core import steps, waits
from tasklease.worker.core.decisions import OperatorRelease, ReleaseOutcome
from tasklease.worker.core.queries import RunFilter, is_stuck, parse_duration
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.core.waits import SignalError, Signalled
from tasklease.worker.dashboard.csrf import Csrf
from tasklease.worker.dashboard.timelines import run_timeline
from tasklease.worker.operate.cancels import cancel_run
from tasklease.worker.operate.operations import OperationRefused, Operations, run_summary
from tasklease.worker.operate.redaction import redacted_bodies
from tasklease.worker.operate.run_ids import AmbiguousRunId

_log = logging.getLogger("tasklease.dashboard")

PAGE_SIZE = 50
# Runs the page offers to cancel: not ended, not cancelled.
CANCELLABLE = frozenset({RunStatus.IN_PROGRESS, RunStatus.RELEASED, RunStatus.WAITING})
# The list's query parameters: only these are carried into its links, never a name url_for
# reads itself (_anchor, _method, _scheme, _external, endpoint).
FILTER_PARAMS = ("status", "handler", "kind", "trigger", "older_than", "newer_than", "stuck")


class Views:
    """The dashboard's pages and its two actions (release, replay), over one :class:`Operations`."""

    def __init__(
        self,
        operations: Operations,
        *,
        schedules: list[Job] | None,
        name: str,
        csrf: Csrf,
    ) -> None:
        self.operations = operations
        self.schedules = schedules
        self.name = name
        self.csrf = csrf

    def runs(self) -> flask.Response:
        now = self.operations.clock()
        args = flask.request.args
        error = None
        page = None
        try:
            if unknown := sorted(set(args) - {*FILTER_PARAMS, "limit", "cursor"}):
                raise ValueError(f"unknown query parameter {unknown[0][:40]!r}")
            filters = _filters(args, now)
            limit = min(max(int(args.get("limit") or PAGE_SIZE), 1), 500)
            page = self.operations.list_runs(filters, limit, args.get("cursor") or None)
        except ValueError as exc:
            error = str(exc)
        stuck = self.operations.list_runs(RunFilter(stuck_at=now), 100).runs
        query: dict[str, Any] = {n: args[n] for n in (*FILTER_PARAMS, "limit") if args.get(n)}
        next_url = None
        if page is not None and page.cursor:
            next_url = flask.url_for(f"{self.name}.runs", **query, cursor=page.cursor)
        return render(
            "runs.html",
            400 if error else 200,
            runs=[_row(r, now) for r in (page.runs if page else [])],
            stuck_count=len(stuck),
            args=args,
            statuses=[s.value for s in RunStatus],
            error=error,
            next_url=next_url,
            filtered=bool(query),
        )

    def stuck(self) -> flask.Response:
        report = self.operations.stuck(self.schedules)
        now = self.operations.clock()
        return render(
            "stuck.html",
            runs=[_row(r, now) for r in report.runs],
            stuck_count=len(report.runs),
            jobs=report.jobs,
            schedules=self.schedules,
        )

    def run(self, run_id: str) -> flask.Response:
        return self._canonical(run_id, "run") or self.detail(run_id)

    def confirm(self, run_id: str, action: str) -> flask.Response:
        if action not in ("release", "replay", "cancel"):
            flask.abort(404)
        moved = self._canonical(run_id, "confirm", action=action)
        if moved is not None:
            return moved
        record = self.operations.store.get(run_id)
        if record is None:
            return render("missing.html", 404, run_id=run_id)
        now = self.operations.clock()
        return render(
            "confirm.html",
            action=action,
            run=_row(record, now),
            live=record.status is RunStatus.IN_PROGRESS and not is_stuck(record, now),
            csrf=self.csrf.page_token(),
        )

    def release(self, run_id: str) -> flask.Response:
        """Release the attempt the confirmation page showed, and only that one."""
        form = flask.request.form
        attempt, token = form.get("attempt_id"), form.get("fencing_token", "")
        if not attempt or not (token.isascii() and token.isdigit()) or len(token) > 20:
            return self.detail(run_id, "Refused: the form names no attempt. Reload the page.", 400)
        decision = self.operations.release(
            run_id, force=form.get("force") == "1", attempt_id=attempt, fencing_token=int(token)
        )
        until = decision.live_until.isoformat() if decision.live_until else ""
        _log.warning(
            "operator %s released run %s, attempt %s: %s%s",
            flask.g.get("operator") or "(local)",
            run_id,
            attempt,
            decision.outcome.value,
            " (forced while its lease was live)" if decision.forced else "",
        )
        forced = f" Warning: its lease was live until {until}; the holder is fenced out."
        notices = {
            ReleaseOutcome.RELEASED: "Released: the next delivery runs it."
            + (forced if decision.forced else ""),
            ReleaseOutcome.ALREADY_RELEASED: "Already released.",
            ReleaseOutcome.LEASE_LIVE: f"Refused: its lease is live until {until}. "
            "Release it anyway only if its holder is gone.",
            ReleaseOutcome.FINISHED: "Refused: the run is finished; replay a failed run instead.",
            ReleaseOutcome.MISSING: "No such run.",
            ReleaseOutcome.HOLDER_CHANGED: _holder_changed(decision, attempt),
        }
        ok = decision.outcome in (ReleaseOutcome.RELEASED, ReleaseOutcome.ALREADY_RELEASED)
        return self.detail(run_id, notices[decision.outcome], 200 if ok else 409)

    def replay(self, run_id: str) -> flask.Response:
        try:
            result = self.operations.replay(run_id)
        except OperationRefused as exc:
            return self.detail(run_id, f"Refused: {exc}", 409)
        _log.warning(
            "operator %s replayed run %s as %s (%s)",
            flask.g.get("operator") or "(local)",
            run_id,
            result.replay_run_id,
            result.outcome.value,
        )
        return self.detail(run_id, result.summary)

    def signal(self, run_id: str) -> flask.Response:
        """Send the signal the run page's form names, with its JSON payload."""
        form = flask.request.form
        name, text = form.get("name", ""), form.get("payload", "").strip()
        try:
            payload = json.loads(text) if text else None
        except ValueError as exc:
            return self.detail(run_id, f"Refused: the payload is not JSON: {exc}", 400)
        try:
            decision = self.operations.signal(run_id, name, payload)
        except SignalError as exc:
            return self.detail(run_id, f"Refused: {exc}", 400)
        except OperationRefused as exc:  # No producer configured to enqueue the resume.
            return self.detail(run_id, f"Refused: {exc}", 409)
        except EnqueueError as exc:
            return self.detail(
                run_id, f"The signal is recorded; its resume could not be enqueued: {exc}", 503
            )
        _log.warning(
            "operator %s sent signal %r to run %s: %s",
            flask.g.get("operator") or "(local)",
            name[:100],
            run_id,
            decision.outcome.value,
        )
        notices = {
            Signalled.RESUMES: "Signal sent: the run resumes.",
            Signalled.KEPT: "Signal kept: the run gets it at its wait.",
            Signalled.DUPLICATE: "A signal of this name was sent before: the run resumes once.",
            Signalled.TIMED_OUT: "Refused: the wait of this name timed out.",
            Signalled.ENDED: "Refused: the run has ended.",
            Signalled.MISSING: "No such run.",
        }
        status = 200 if decision.outcome.accepted else 409
        return self.detail(run_id, notices[decision.outcome], status)

    def cancel(self, run_id: str) -> flask.Response:
        """Cancel the run (:mod:`tasklease.worker.operate.cancels`), for the operator."""
        by = flask.g.get("operator") or "a local dashboard operator"
        result = cancel_run(self.operations.store, run_id, by, clock=self.operations.clock)
        _log.warning("operator %s cancelled run %s: %s", by, run_id, result.outcome.value)
        return self.detail(
            run_id, result.summary.capitalize() + ".", 200 if result.accepted else 409
        )

    def _canonical(self, run_id: str, endpoint: str, **values: Any) -> flask.Response | None:
        """A redirect to the page under the whole id a run id prefix names, a 400 page
        listing the runs an ambiguous one names, else None: ``run_id`` is whole."""
        try:
            whole = self.operations.resolve(run_id)
        except AmbiguousRunId as exc:
            return render("missing.html", 400, run_id=run_id, notice=str(exc))
        if whole == run_id:
            return None
        where = flask.url_for(f".{endpoint}", run_id=whole, **values)
        return flask.Response("", 303, headers={"Location": where})

    def unavailable(self, error: StoreUnavailable) -> flask.Response:
        return render("denied.html", 503, reason=f"The store is unavailable: {error}")

    def detail(self, run_id: str, notice: str | None = None, status: int = 200) -> flask.Response:
        record = self.operations.show(run_id)
        if record is None:
            return render("missing.html", 404, run_id=run_id, notice=notice)
        now = self.operations.clock()
        return render(
            "run.html",
            status,
            run=_row(record, now),
            notice=notice,
            bodies={
                name: None if value is None else json.dumps(value, indent=2, sort_keys=True)
                for name, value in redacted_bodies(record.payload, record.result_json).items()
            },
            releasable=record.status is RunStatus.IN_PROGRESS,
            replayable=record.status is RunStatus.FAILED and record.kind == "task",
            cancellable=record.status in CANCELLABLE and record.cancelled_at is None,
            timeline=run_timeline(self.operations.store, record, now),
            steps=steps.summary(record),
            waits=waits.summary(record),
            csrf=self.csrf.page_token(),
            fan_ins=self.operations.fan_ins(record.run_id),
        )


def render(template: str, status: int = 200, **context: Any) -> flask.Response:
    context.setdefault("notice", None)
    html = flask.render_template(f"tasklease_dashboard/{template}", **context)
    return flask.Response(html, status, mimetype="text/html")


def _filters(args: Any, now: Any) -> RunFilter:
    status = args.get("status") or None
    manual = {"manual": True, "scheduled": False}.get(args.get("trigger") or "")
    older, newer = args.get("older_than"), args.get("newer_than")
    return RunFilter(
        status=RunStatus(status) if status else None,
        handler=args.get("handler") or None,
        kind=args.get("kind") or None,
        older_than=now - parse_duration(older) if older else None,
        newer_than=now - parse_duration(newer) if newer else None,
        manual=manual,
        stuck_at=now if args.get("stuck") else None,
    )


def _row(record: RunRecord, now: Any) -> dict[str, Any]:
    summary = run_summary(record, now)
    summary["error_line"] = (record.error or "").splitlines()[0][:120] if record.error else ""
    summary["label"] = (
        record.identity.get("task_name") or record.identity.get("job_name") or record.run_id[:12]
    )
    return summary


def _holder_changed(decision: OperatorRelease, seen: str) -> str:
    record = decision.record
    now = f" attempt {record.attempt_id} (fencing token {record.fencing_token})" if record else ""
    return (
        f"Refused: attempt {seen}, shown when you asked, no longer holds this run;{now} took "
        "it over since. Nothing was released: look at the run again before releasing it."
    )
