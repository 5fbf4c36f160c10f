"""``POST /signals/<run_id>/<name>``: send a signal to a waiting run over HTTP, for webhooks
and other services. The body is the signal's JSON payload (empty: null).

Authenticated as a delivery to the run's handler is (the same tokens, allow-list and
audience), so a caller allowed to run a handler's tasks may signal its runs and no other
caller may. A request for a run the store does not keep is checked against the worker's own
settings first: a caller that is not allowed learns nothing of which runs exist.

Answers: 200 when the run gets the signal (also for one sent again: it resumes once), 409
when the run has ended or the wait of that name timed out, 404 for no such run, 400 for a
name or payload that cannot be sent, 401/403 for a caller that may not, 503 when the store
or the queue could not be reached (send it again).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import flask

from tasklease import protocol
from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.worker.auth.authenticators import AuthRequest
from tasklease.worker.core import waits
from tasklease.worker.core.identity import Kind
from tasklease.worker.handlers.spec import HandlerSpec
from tasklease.worker.operate.signals import send_signal

if TYPE_CHECKING:
    from tasklease.worker.delivery.executor import Executor

__all__ = ["SIGNAL_ROUTE", "register_signal_route"]

SIGNAL_ROUTE = protocol.SIGNAL_ROUTE_PREFIX + "<run_id>/<path:name>"
_MAX_BODY = waits.MAX_SIGNAL_PAYLOAD_BYTES
_log = logging.getLogger("tasklease.signals")


def _no_handler(*_: Any) -> None:
    return None


# Checks a caller against the worker's own settings (no handler's): for a run not kept.
_WORKER = HandlerSpec(Kind.TASK, "", _no_handler)

_STATUS = {
    waits.Signalled.RESUMES: 200,
    waits.Signalled.KEPT: 200,
    waits.Signalled.DUPLICATE: 200,
    waits.Signalled.TIMED_OUT: 409,
    waits.Signalled.ENDED: 409,
    waits.Signalled.MISSING: 404,
}


def _answer(status: int, run_id: str, name: str, message: str, **fields: Any) -> flask.Response:
    body = {"run_id": run_id, "signal": name, "message": message, **fields}
    _log.log(
        logging.INFO if status < 500 else logging.WARNING,
        "signal %s to run %s: %s",
        name[:100],
        run_id[:64],
        message,
        extra={"tasklease": {"run_id": run_id[:64], "signal": name[:100], "status": status}},
    )
    return flask.Response(json.dumps(body), status, mimetype="application/json")


def register_signal_route(app: flask.Flask, executor: Executor, *, mount: str = "") -> None:
    """Add the signal route to ``app``, answered through ``executor``'s store, router and
    authenticator."""

    def signal_view(run_id: str, name: str) -> flask.Response:
        request = flask.request
        try:
            record = executor.store.get(run_id)
        except StoreUnavailable as exc:
            return _answer(503, run_id, name, f"the store is unavailable: {exc}")
        spec = (
            None if record is None else executor.router.handler(Kind(record.kind), record.handler)
        )
        auth = executor.authenticator.authenticate(
            AuthRequest(request.headers.get("Authorization"), request.url, mount), spec or _WORKER
        )
        if not auth.allowed:
            return _answer(auth.status, run_id, name, auth.reason)
        if record is None:
            return _answer(404, run_id, name, "no such run", outcome="missing", accepted=False)
        raw = request.get_data(cache=False)
        if len(raw) > _MAX_BODY:
            return _answer(400, run_id, name, f"the payload is over {_MAX_BODY} bytes")
        try:
            payload = json.loads(raw) if raw.strip() else None
        except ValueError as exc:
            return _answer(400, run_id, name, f"the body is not JSON: {exc}")
        except RecursionError:
            return _answer(400, run_id, name, "the body is not JSON: nested too deeply")
        try:
            producer = executor.router.producer()
        except ConfigurationError as exc:  # Before anything is recorded.
            return _answer(503, run_id, name, f"the signal is not recorded: {exc}")
        try:
            decision = send_signal(
                run_id,
                name,
                payload,
                store=executor.store,
                producer=producer,
                clock=executor.clock,
            )
        except waits.SignalError as exc:
            return _answer(400, run_id, name, str(exc))
        except StoreUnavailable as exc:
            return _answer(503, run_id, name, f"the store is unavailable: {exc}")
        except Exception as exc:  # The queue refused or failed: the signal is kept.
            return _answer(
                503,
                run_id,
                name,
                f"the signal is recorded, its resume task could not be created "
                f"({type(exc).__name__}: {exc}): send it again",
            )
        outcome = decision.outcome
        return _answer(
            _STATUS[outcome],
            run_id,
            name,
            outcome.value.replace("_", " "),
            outcome=outcome.value,
            accepted=outcome.accepted,
        )

    app.add_url_rule(SIGNAL_ROUTE, "tasklease_signal", signal_view, methods=["POST"])
