"""The dashboard's defence against forms posted by other pages.

Cookies are not isolated by port (RFC 6265, section 8.5): a page on another port of the same
host can plant the dashboard's cookie, so a token that merely equals its cookie proves
nothing. The cookie here holds a random nonce and the form the HMAC of that nonce (and the
operator) under a secret only the server knows, checked with :func:`hmac.compare_digest`.
Every state change must also come from the dashboard's own origin (scheme, host and port)
by its ``Origin`` header, else its ``Referer``: ``Origin: null`` (what a browser sends after
a cross-origin redirect, or from a sandboxed frame) and no origin at all are refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from urllib.parse import urlsplit

import flask

from tasklease import protocol
from tasklease.errors import ConfigurationError

CSRF_COOKIE = "tasklease_csrf"
CSRF_FIELD = "csrf_token"
MIN_SECRET_CHARS = 32
_NONCE = re.compile(r"[A-Za-z0-9_-]{43}", re.ASCII)
_DEFAULT_PORTS = {"http": 80, "https": 443}


class Csrf:
    """Issues and checks CSRF tokens under ``secret`` (default ``TASKLEASE_DASHBOARD_SECRET``,
    else a random one for this process: then every process of a worker has its own, and a
    form may be refused as stale when another process answers it)."""

    def __init__(self, secret: str | None = None) -> None:
        secret = secret if secret is not None else os.environ.get(protocol.ENV_DASHBOARD_SECRET)
        if secret is not None and len(secret) < MIN_SECRET_CHARS:
            raise ConfigurationError(
                f"{protocol.ENV_DASHBOARD_SECRET}: use at least {MIN_SECRET_CHARS} random "
                "characters "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        self._key = secret.encode() if secret else secrets.token_bytes(32)

    def token(self, nonce: str, operator: str | None) -> str:
        """The form token of a cookie's ``nonce`` for ``operator`` (None: no login)."""
        message = f"{nonce}\0{operator or ''}".encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def page_token(self) -> str:
        """The token for this page's forms: of the cookie's nonce, or of a new nonce, which
        the response then sets (``flask.g.csrf_new``)."""
        nonce = flask.request.cookies.get(CSRF_COOKIE, "")
        if not _NONCE.fullmatch(nonce):
            nonce = secrets.token_urlsafe(32)
            flask.g.csrf_new = nonce
        return self.token(nonce, flask.g.get("operator"))

    def refusal(self) -> str | None:
        """Why this state change is refused, or None: it came from this very origin and
        carries the token of its cookie."""
        request = flask.request
        claimed = request.headers.get("Origin") or request.headers.get("Referer")
        if not claimed or _origin(claimed) != own_origin():
            return "Refused: the form did not come from this dashboard's own page."
        nonce = request.cookies.get(CSRF_COOKIE, "")
        form = request.form.get(CSRF_FIELD, "")
        expected = self.token(nonce, flask.g.get("operator"))
        if not _NONCE.fullmatch(nonce) or not hmac.compare_digest(expected, form):
            return "Refused: the form's CSRF token is missing or stale. Reload the page."
        return None


def own_origin() -> tuple[str, str, int] | None:
    """This request's own origin as the browser sees it: https when the request is, or when
    the front end (Cloud Run's) says the browser used https."""
    request = flask.request
    https = request.is_secure or request.headers.get("X-Forwarded-Proto") == "https"
    return _origin(f"{'https' if https else 'http'}://{request.host}")


def _origin(url: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of a URL, ports made explicit; None when it has none."""
    try:
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # A port that is not a number, or out of range.
        return None
    if scheme not in _DEFAULT_PORTS or not host or port is None:
        return None
    return (scheme, host, port)
