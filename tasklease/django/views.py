"""The delivery views: a Django request adapted to tasklease's Executor, answered and
logged exactly as the Flask and ASGI workers answer (same OIDC, answers, log line)."""

from __future__ import annotations

import time

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, UnreadablePostError
from django.views.decorators.csrf import csrf_exempt

from tasklease import protocol
from tasklease.django import worker
from tasklease.worker.core.identity import Kind
from tasklease.worker.delivery.executor import Delivery
from tasklease.worker.delivery.reply import Reply
from tasklease.worker.observe.logs import request_fields
from tasklease.worker.serving.wsgi_routes import BadBody, crashed, header_lookup, read_body

_PREFIXES = {Kind.TASK: protocol.TASK_ROUTE_PREFIX, Kind.SCHEDULER: protocol.SCHEDULER_ROUTE_PREFIX}


@csrf_exempt  # type: ignore[untyped-decorator] # Deliveries carry an OIDC token, no cookie.
def task(request: HttpRequest, name: str) -> HttpResponse:
    """``/tasks/<name>``: a Cloud Tasks delivery."""
    return _deliver(request, Kind.TASK, name)


@csrf_exempt  # type: ignore[untyped-decorator]
def job(request: HttpRequest, name: str) -> HttpResponse:
    """``/jobs/<name>``: a Cloud Scheduler run."""
    return _deliver(request, Kind.SCHEDULER, name)


class _EveryDatabase(frozenset[str]):
    """Every database alias, for Django's ``_non_atomic_requests`` (which it reads with
    ``in``; django/core/handlers/base.py ``make_view_atomic``)."""

    def __contains__(self, alias: object) -> bool:
        return True


# No ATOMIC_REQUESTS transaction around a delivery: the executor answers a task that raised
# with a 500 from a view that returns, which Django would commit, and it records the run
# before the view returns. The task itself runs in that transaction instead (handler.py).
for _view in (task, job):
    _view.__dict__["_non_atomic_requests"] = _EveryDatabase()


def _deliver(request: HttpRequest, kind: Kind, name: str) -> HttpResponse:
    started = time.monotonic()
    routes = worker.routes()
    limit = routes.max_body_bytes
    body, refusal = _body(request, limit)
    suffix = f"{_PREFIXES[kind]}{name}"
    # Where the URLconf includes these views: part of a handler's default OIDC audience.
    mount = request.path[: -len(suffix)] if request.path.endswith(suffix) else ""
    delivery = Delivery(
        kind=kind,
        handler=name,
        header=header_lookup(request.META),
        query={key: request.GET[key] for key in request.GET},
        body=body,
        body_limit=limit,
        refusal=refusal,
        url=request.get_full_path(),
        authorization=request.META.get("HTTP_AUTHORIZATION"),
        method=request.method or "GET",
        mount=mount.rstrip("/"),
    )
    with request_fields(routes.fields):
        try:
            reply = routes.executor.execute(delivery)
        except Exception as exc:  # A bug: still one line and a JSON answer.
            reply = crashed(kind, name, delivery.method, started, exc)
    return _respond(reply)


def _body(request: HttpRequest, limit: int) -> tuple[bytes | None, str | None]:
    """The body (None: over ``limit``, not read) and a refusal for a malformed length, or
    for a body that ended before it (the sender's connection broke: WSGI servers hand over
    what arrived), as the Flask and ASGI routes refuse it: a cut body must never reach the
    handler, or be dead-lettered as bad JSON, when the retry will carry the whole of it.

    Under WSGI a body without Content-Length (chunked, or framed by the server:
    ``wsgi.input_terminated``) is read from the server's stream as the Flask routes read it:
    Django reads no further than Content-Length, and would read it as empty."""
    length = request.META.get("CONTENT_LENGTH") or ""
    if not length and "wsgi.input" in request.META:
        # Under WSGI, a body the server frames: Django would read none of it (nor has any
        # middleware: it reads no further than Content-Length). Under ASGI Django has read
        # the whole body, whatever its framing.
        try:
            return read_body(request.META, limit), None
        except BadBody as exc:
            return b"", str(exc)
    if length and not (length.isascii() and length.isdigit()):
        return b"", f"Content-Length {length[:40]!r} is not a number"
    if length and int(length) > limit:
        return None, None
    try:
        body = request.body
    except RequestDataTooBig:  # Over Django's DATA_UPLOAD_MAX_MEMORY_SIZE.
        return None, None
    except UnreadablePostError as exc:  # The connection broke while the body was read.
        return b"", f"the body could not be read: {exc}"
    if length and len(body) != int(length):
        return b"", f"the body ended after {len(body)} of its {length} bytes"
    return (None if len(body) > limit else body), None


def _respond(reply: Reply) -> HttpResponse:
    response = HttpResponse(
        reply.body_bytes(), status=reply.status, content_type="application/json"
    )
    for key, value in reply.headers().items():
        response[key] = value
    if reply.status == 405:
        response["Allow"] = "POST"
    return response
