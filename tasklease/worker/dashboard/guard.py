"""What every dashboard request passes before its page (the Host name against DNS rebinding,
the operator's OIDC token, a form's CSRF token) and the headers every answer carries."""

from __future__ import annotations

import flask

from tasklease.plumbing.hosts import host_name
from tasklease.worker.dashboard.csrf import CSRF_COOKIE, Csrf
from tasklease.worker.dashboard.operators import OperatorAuth
from tasklease.worker.dashboard.views import render


class Guard:
    """The blueprint's ``before_request`` (:meth:`check`) and ``after_request``
    (:meth:`headers`)."""

    def __init__(
        self,
        *,
        auth: OperatorAuth | None,
        hosts: frozenset[str] | None,
        csrf: Csrf,
        name: str,
    ) -> None:
        self.auth = auth
        self.hosts = hosts  # None: any Host (behind OIDC, the front end's name).
        self.csrf = csrf
        self.name = name

    def check(self) -> flask.Response | None:
        """Before each request: the Host name, the operator, a POST's CSRF token."""
        host = host_name(flask.request.headers.get("Host", ""))
        if self.hosts is not None and host not in self.hosts:
            # DNS rebinding: a page that points its own name at 127.0.0.1 sends that name.
            return render("denied.html", 403, reason="Refused: not a host name it answers to.")
        if self.auth is not None:
            request = flask.request
            result = self.auth.check(request.headers.get("Authorization"), request.url)
            if not result.allowed:
                response = render("denied.html", result.status, reason=result.reason)
                if result.status == 401:
                    response.headers["WWW-Authenticate"] = 'Bearer realm="tasklease dashboard"'
                return response
            flask.g.operator = result.principal
        if flask.request.method == "POST" and (refusal := self.csrf.refusal()):
            return render("denied.html", 403, reason=refusal)
        return None

    def headers(self, response: flask.Response) -> flask.Response:
        """After each request: no caching, no framing, a strict policy; a new CSRF cookie."""
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
