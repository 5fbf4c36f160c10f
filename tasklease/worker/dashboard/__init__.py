"""The operators' web page: runs with filters, a run's detail, stuck runs, release and replay.

Server-rendered (Flask + Jinja, no JavaScript), over the same :class:`~tasklease.worker.operations.
Operations` as ``tasklease runs``. Standalone: ``tasklease dashboard`` (loopback, no login,
answering loopback ``Host`` names only); inside the worker: ``create_app(...,
dashboard="/tasklease")``, behind OIDC for the operators named. Forms: :mod:`.csrf`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import flask

from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.plumbing.hosts import LOOPBACK_HOSTS, allowed_host_names, host_name
from tasklease.worker.auth import Authenticator
from tasklease.worker.core.decisions import OperatorRelease, ReleaseOutcome
from tasklease.worker.core.queries import RunFilter, is_stuck, parse_duration
from tasklease.worker.core.records import RunRecord, RunStatus
from tasklease.worker.dashboard.csrf import CSRF_COOKIE, CSRF_FIELD, Csrf
from tasklease.worker.dashboard.operators import OperatorAuth
from tasklease.worker.operations import OperationRefused, Operations, run_summary
from tasklease.worker.router import HandlerSpec
from tasklease.worker.schedules import Schedule
from tasklease.worker.stores.base import LeaseStore

_log = logging.getLogger("tasklease.dashboard")

PAGE_SIZE = 50
# The list's query parameters: only these are carried into its links, never a name url_for
# reads itself (_anchor, _method, _scheme, _external, endpoint).
FILTER_PARAMS = ("status", "handler", "kind", "trigger", "older_than", "newer_than", "stuck")


def dashboard_blueprint(
    store: LeaseStore,
    *,
    auth: OperatorAuth | None = None,
    schedules: list[Schedule] | None = None,
    producer: Any = None,
    name: str = "tasklease_dashboard",
    allowed_hosts: frozenset[str] | None = None,
    csrf_secret: str | None = None,
) -> flask.Blueprint:
    """The dashboard as a blueprint; register it with ``url_prefix``.

    ``auth`` None serves everyone (the standalone, loopback dashboard); it then answers only
    ``Host`` names in ``allowed_hosts`` (default: loopback names). ``producer``: a
    :class:`tasklease.producer.Producer` or a factory for replays (default: ``Producer.from_env``).
    ``csrf_secret``: signs the forms' tokens (default ``TASKLEASE_DASHBOARD_SECRET``, else
    random per process).
    """
    if allowed_hosts is None and auth is None:
        allowed_hosts = LOOPBACK_HOSTS
    operations = Operations(store, producer)
    views = _Views(
        operations,
        auth=auth,
        schedules=schedules,
        name=name,
        hosts=allowed_hosts,
        csrf=Csrf(csrf_secret),
    )
    blueprint = flask.Blueprint(name, __name__, template_folder="templates")
    blueprint.before_request(views.guard)
    blueprint.after_request(views.headers)
    blueprint.add_url_rule("/", "runs", views.runs, methods=["GET"])
    blueprint.add_url_rule("/stuck", "stuck", views.stuck, methods=["GET"])
    blueprint.add_url_rule("/runs/<run_id>", "run", views.run, methods=["GET"])
    blueprint.add_url_rule("/runs/<run_id>/<action>", "confirm", views.confirm, methods=["GET"])
    blueprint.add_url_rule("/runs/<run_id>/release", "release", views.release, methods=["POST"])
    blueprint.add_url_rule("/runs/<run_id>/replay", "replay", views.replay, methods=["POST"])
    blueprint.register_error_handler(StoreUnavailable, views.unavailable)
    return blueprint


class _Views:
    """The dashboard's pages, over one :class:`Operations`."""

    def __init__(
        self,
        operations: Operations,
        *,
        auth: OperatorAuth | None,
        schedules: list[Schedule] | None,
        name: str,
        hosts: frozenset[str] | None,
        csrf: Csrf,
    ) -> None:
        self.operations = operations
        self.auth = auth
        self.schedules = schedules
        self.name = name
        self.hosts = hosts  # None: any Host (behind OIDC, the front end's name).
        self.csrf = csrf

    def guard(self) -> flask.Response | None:
        host = host_name(flask.request.headers.get("Host", ""))
        if self.hosts is not None and host not in self.hosts:
            # DNS rebinding: a page that points its own name at 127.0.0.1 sends that name.
            return _page("denied.html", 403, reason="Refused: not a host name it answers to.")
        if self.auth is not None:
            request = flask.request
            result = self.auth.check(request.headers.get("Authorization"), request.url)
            if not result.allowed:
                response = _page("denied.html", result.status, reason=result.reason)
                if result.status == 401:
                    response.headers["WWW-Authenticate"] = 'Bearer realm="tasklease dashboard"'
                return response
            flask.g.operator = result.principal
        if flask.request.method == "POST" and (refusal := self.csrf.refusal()):
            return _page("denied.html", 403, reason=refusal)
        return None

    def headers(self, response: flask.Response) -> flask.Response:
        response.headers.setdefault("Cache-Control", "no-store")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
            "form-action 'self'; frame-ancestors 'none'",
        )
        token = flask.g.get("csrf_new")
        if token:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                samesite="Strict",
                # Behind Cloud Run's front end the app sees http; the browser used https.
                secure=flask.request.is_secure
                or flask.request.headers.get("X-Forwarded-Proto") == "https",
                path=flask.url_for(f"{self.name}.runs"),
            )
        return response

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
        return _page(
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
        return _page(
            "stuck.html",
            runs=[_row(r, now) for r in report.runs],
            stuck_count=len(report.runs),
            jobs=report.jobs,
            schedules=self.schedules,
        )

    def run(self, run_id: str) -> flask.Response:
        return self.detail(run_id)

    def confirm(self, run_id: str, action: str) -> flask.Response:
        if action not in ("release", "replay"):
            flask.abort(404)
        record = self.operations.store.get(run_id)
        if record is None:
            return _page("missing.html", 404, run_id=run_id)
        now = self.operations.clock()
        return _page(
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
        if not attempt or not token.isdigit() or len(token) > 20:
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

    def unavailable(self, error: StoreUnavailable) -> flask.Response:
        return _page("denied.html", 503, reason=f"The store is unavailable: {error}")

    def detail(self, run_id: str, notice: str | None = None, status: int = 200) -> flask.Response:
        record = self.operations.show(run_id)
        if record is None:
            return _page("missing.html", 404, run_id=run_id, notice=notice)
        now = self.operations.clock()
        return _page(
            "run.html",
            status,
            run=_row(record, now),
            notice=notice,
            releasable=record.status is RunStatus.IN_PROGRESS,
            replayable=record.status is RunStatus.FAILED and record.kind == "task",
        )


def _page(template: str, status: int = 200, **context: Any) -> flask.Response:
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


def create_dashboard_app(
    store: LeaseStore,
    *,
    schedules: list[Schedule] | None = None,
    producer: Any = None,
    auth: OperatorAuth | None = None,
    host: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
    csrf_secret: str | None = None,
) -> flask.Flask:
    """The standalone dashboard (``tasklease dashboard``): the blueprint at ``/``. It answers
    only ``Host`` names that are loopback, ``host`` (its bind address) or ``allowed_hosts``."""
    app = flask.Flask("tasklease_dashboard")
    blueprint = dashboard_blueprint(
        store,
        auth=auth,
        schedules=schedules,
        producer=producer,
        allowed_hosts=allowed_host_names(host, allowed_hosts),
        csrf_secret=csrf_secret,
    )
    app.register_blueprint(blueprint)
    return app


def mount(
    app: flask.Flask,
    prefix: str,
    store: LeaseStore,
    authenticator: Authenticator,
    *,
    operators: Iterable[str] | None = None,
    audience: str | None = None,
    deliveries: Iterable[HandlerSpec] = (),
    csrf_secret: str | None = None,
) -> None:
    """Mount the dashboard in a worker app at ``prefix``, behind ``authenticator``, for
    ``operators`` (required with authentication on) with tokens for ``audience`` (default:
    the worker's). An operator that also delivers one of ``deliveries`` needs an audience of
    its own (:meth:`OperatorAuth.check_apart_from`)."""
    if not prefix.startswith("/") or prefix.rstrip("/") in ("", "/tasks", "/jobs"):
        raise ConfigurationError(f"dashboard prefix {prefix!r}: use a path such as /tasklease")
    operator_list = tuple(o.strip() for o in operators if o.strip()) if operators else None
    auth = OperatorAuth(authenticator, operator_list, audience)
    auth.check_apart_from(deliveries)
    blueprint = dashboard_blueprint(store, auth=auth, csrf_secret=csrf_secret)
    app.register_blueprint(blueprint, url_prefix=prefix.rstrip("/"))


__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "OperatorAuth",
    "create_dashboard_app",
    "dashboard_blueprint",
    "mount",
]
