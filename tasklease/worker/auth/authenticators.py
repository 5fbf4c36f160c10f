"""Request authentication: who may make the worker run a handler.

``X-CloudTasks-*`` and ``X-CloudScheduler-*`` headers can be forged by anyone who reaches the
URL (docs/platform-facts.md, "Authentication"), so the worker trusts a delivery only when it carries
a Google-signed OIDC ID token for an allowed service account.
"""

from __future__ import annotations

import logging
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.plumbing.loopback import is_loopback_url
from tasklease.worker.core import constants as c
from tasklease.worker.handlers.router import HandlerSpec

if TYPE_CHECKING:
    import requests

_log = logging.getLogger("tasklease.auth")

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
GOOGLE_ISSUERS = ("accounts.google.com", "https://accounts.google.com")
# Tolerated clock difference between Google's token issuers and this host.
CLOCK_SKEW_SECONDS = 30
# Three base64url segments: anything else is refused before the keys are fetched.
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*", re.ASCII)
_MAX_TOKEN_CHARS = 16 * 1024
# The whole answer to a 401: why it was refused goes to the log line only. google-auth's
# "expected one of [...]" would tell anyone holding a Google token the audiences configured.
UNAUTHENTICATED = "missing or invalid OIDC ID token"


@dataclass(frozen=True)
class AuthResult:
    """An authentication decision: ``status`` 200 lets the request through."""

    status: int
    reason: str  # Sent in the answer.
    principal: str | None = None
    detail: str | None = None  # Why it was refused, for the request's log line only.

    @property
    def allowed(self) -> bool:
        return self.status == 200

    def log_fields(self) -> dict[str, str | None]:
        """The fields this decision adds to the request's log line."""
        fields = {"caller": self.principal}
        if self.detail is not None:
            fields["auth_error"] = self.detail
        return fields


@dataclass(frozen=True)
class AuthRequest:
    """What an authenticator sees of a request."""

    authorization: str | None
    url: str  # The URL as the request addressed it. Never an audience: its Host is the caller's.
    # Where the server mounts the worker's routes (an ASGI root_path such as "/worker"): the
    # server's configuration, never the request's. Cloud Tasks' default audience is the
    # handler's whole URL, so a mounted handler's is the origin, this prefix, then its path.
    mount: str = ""


class Authenticator(ABC):
    """Decides whether a request may run ``spec``. Implement :meth:`authenticate`.

    Called once per request from many threads; must not raise for a bad request (answer a
    401 or 403 :class:`AuthResult`), and must never log the token itself.
    """

    @abstractmethod
    def authenticate(self, request: AuthRequest, spec: HandlerSpec) -> AuthResult:
        """Allow or refuse one request."""


class NoAuth(Authenticator):
    """Lets every request through. Only for local development behind a private network."""

    def authenticate(self, request: AuthRequest, spec: HandlerSpec) -> AuthResult:
        return AuthResult(200, "authentication is off")


class OidcAuth(Authenticator):
    """Verifies ``Authorization: Bearer`` as an OIDC ID token signed by Google (or by the keys
    at ``certs_url``, such as the local emulator's).

    Checks signature, expiry, issuer, audience, ``email_verified``, and ``email`` in the
    allow-list (per handler if the handler sets one). The audience is the handler's
    ``audience``, else ``audience`` here (``TASKLEASE_AUDIENCE``); when that is a root URL, the
    handler's own URL under it (Cloud Tasks' and Scheduler's default audience) is accepted too,
    with the query string this request carries when it has one. A 401 answers
    :data:`UNAUTHENTICATED` only; its reason is in :attr:`AuthResult.detail`.
    It is never taken from the request: ``Host`` and ``X-Forwarded-Proto`` are the caller's to
    choose, so a token minted for another service could be replayed here. Public keys are
    fetched through an HTTP cache that honours ``Cache-Control``, not on every request.
    """

    def __init__(
        self,
        allowed_service_accounts: Iterable[str],
        *,
        audience: str | None = None,
        certs_url: str = GOOGLE_CERTS_URL,
        issuers: Sequence[str] = GOOGLE_ISSUERS,
        session: requests.Session | None = None,
        fetch_timeout: float = c.FETCH_TIMEOUT_SECONDS,
    ) -> None:
        self.allowed_service_accounts = frozenset(
            a.strip() for a in allowed_service_accounts if a.strip()
        )
        self.audience = audience
        scheme = urlsplit(certs_url).scheme
        if scheme != "https" and not (scheme == "http" and is_loopback_url(certs_url)):
            # Over plain http, anyone on the path could serve their own keys.
            raise ConfigurationError(
                f"{protocol.ENV_OIDC_CERTS_URL}={certs_url!r}: the keys must come over https "
                "(plain http only from a loopback address such as the local emulator)"
            )
        self.certs_url = certs_url
        self.issuers = tuple(issuers)
        # google-auth, requests and the HTTP cache load only for a worker that verifies tokens.
        from tasklease.worker.auth.keys import KeyFetcher  # noqa: PLC0415

        self._transport = KeyFetcher(session, timeout=fetch_timeout)

    @classmethod
    def from_env(cls, audience: str | None = None) -> OidcAuth:
        """Configured from ``TASKLEASE_ALLOWED_SERVICE_ACCOUNTS`` (comma-separated),
        ``TASKLEASE_AUDIENCE`` (unless ``audience`` is given), ``TASKLEASE_OIDC_CERTS_URL`` and
        ``TASKLEASE_OIDC_ISSUERS``."""
        issuers = _split(os.environ.get(protocol.ENV_OIDC_ISSUERS, ""))
        return cls(
            _split(os.environ.get(protocol.ENV_ALLOWED_SERVICE_ACCOUNTS, "")),
            audience=audience or os.environ.get(protocol.ENV_AUDIENCE, "").strip() or None,
            certs_url=os.environ.get(protocol.ENV_OIDC_CERTS_URL) or GOOGLE_CERTS_URL,
            issuers=issuers or GOOGLE_ISSUERS,
        )

    def check_configuration(self, specs: Iterable[HandlerSpec]) -> None:
        """Refuse to start when some handler could never be called, or has no audience."""
        for spec in specs:
            if not (spec.audience or self.audience):
                raise ConfigurationError(
                    f"OIDC authentication is on but no token audience is set for {spec.path}: "
                    f"set {protocol.ENV_AUDIENCE} to the worker's URL "
                    "(e.g. https://SERVICE.run.app), "
                    "or pass create_app(..., audience=...) or the handler's audience. It is "
                    "never taken from the request's Host header, which the caller chooses."
                )
            if not self._allowed_for(spec):
                raise ConfigurationError(
                    f"OIDC authentication is on but no service account may call {spec.path}: "
                    f"set {protocol.ENV_ALLOWED_SERVICE_ACCOUNTS} (or the handler's "
                    "allowed_service_accounts), or pass auth='none' for local development"
                )

    def authenticate(self, request: AuthRequest, spec: HandlerSpec) -> AuthResult:
        import google.auth.exceptions  # noqa: PLC0415 - loaded once, by __init__'s KeyFetcher.
        from google.oauth2 import id_token  # noqa: PLC0415

        scheme, _, token = (request.authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _unauthenticated("missing Authorization: Bearer <OIDC ID token>")
        if len(token) > _MAX_TOKEN_CHARS or not _JWT_SHAPE.fullmatch(token):
            return _unauthenticated("invalid ID token: not a JWT")
        configured = spec.audience or self.audience
        if not configured:  # check_configuration refuses this at start; never guess.
            return _unauthenticated("no token audience is configured for this handler")
        path = request.mount + spec.path
        audiences = expected_audiences(configured, path, urlsplit(request.url).query)
        try:
            claims: dict[str, Any] = dict(
                id_token.verify_token(
                    token,
                    self._transport,
                    audience=audiences,
                    certs_url=self.certs_url,
                    clock_skew_in_seconds=CLOCK_SKEW_SECONDS,
                )
            )
        except google.auth.exceptions.TransportError:  # KeyFetcher logged it, once.
            return AuthResult(503, "could not fetch the OIDC public keys to verify the token")
        except (ValueError, google.auth.exceptions.GoogleAuthError) as exc:
            return _unauthenticated(f"invalid ID token: {_redacted(exc, token)}")
        except Exception as exc:  # pyjwt and cryptography raise their own types for bad input
            return _unauthenticated(f"invalid ID token: {type(exc).__name__}")
        if claims.get("iss") not in self.issuers:
            return _unauthenticated(
                f"ID token issuer {str(claims.get('iss'))[:200]!r} is not trusted"
            )
        email = claims.get("email")
        if not isinstance(email, str) or claims.get("email_verified") is not True:
            return AuthResult(403, "ID token carries no verified email")
        if email not in self._allowed_for(spec):
            return AuthResult(403, f"service account {email} may not call {spec.path}", email)
        return AuthResult(200, "ID token verified", email)

    def _allowed_for(self, spec: HandlerSpec) -> frozenset[str]:
        if spec.allowed_service_accounts is not None:
            return frozenset(spec.allowed_service_accounts)
        return self.allowed_service_accounts


def authenticator_for(
    auth: str | Authenticator | None, audience: str | None = None
) -> Authenticator:
    """Resolve ``create_app``'s ``auth`` argument (or ``TASKLEASE_AUTH``) to an authenticator;
    ``audience`` overrides ``TASKLEASE_AUDIENCE``."""
    if isinstance(auth, Authenticator):
        if audience is not None:
            raise ConfigurationError("pass the audience to your Authenticator, not create_app")
        return auth
    # Exactly "oidc" or "none", in any case: a near miss such as " none" or "off" must not
    # silently pick either mode.
    choice = (auth if auth is not None else os.environ.get(protocol.ENV_AUTH, "")) or "oidc"
    if choice.lower() == "none":
        _log.warning(
            "request authentication is OFF (auth='none'): anyone who can reach this worker can "
            "forge Cloud Tasks / Cloud Scheduler headers and run its handlers. Use it only for "
            "local development."
        )
        return NoAuth()
    if choice.lower() == "oidc":
        return OidcAuth.from_env(audience)
    raise ConfigurationError(f"unknown auth {choice!r}: use 'oidc' (the default) or 'none'")


def expected_audiences(configured: str, path: str, query: str = "") -> list[str]:
    """The audiences a token may carry for the handler at ``path``: ``configured`` itself and,
    when it is a service's root URL, that URL with or without ``/`` and the handler's URL under
    it (what Cloud Tasks and Scheduler put in the token when the task or job sets none).

    That default audience is the target's whole URL, query string included (the ``audience``
    field of Cloud Tasks' and Cloud Scheduler's OidcToken: "If not specified, the URI specified
    in target will be used"), so with a ``query`` (this request's own, as received) the
    handler's URL with it is accepted too: exactly the URL the request was made to, never
    another path, and a token minted for one query is refused with another."""
    parts = urlsplit(configured)
    if parts.path not in ("", "/") or parts.query or not parts.netloc:
        return [configured]
    origin = f"{parts.scheme}://{parts.netloc}"
    audiences = [configured, origin, origin + "/", origin + path]
    if query:
        audiences.append(f"{origin}{path}?{query}")
    return audiences


def _unauthenticated(detail: str) -> AuthResult:
    return AuthResult(401, UNAUTHENTICATED, detail=detail)


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _redacted(error: BaseException, token: str) -> str:
    """The error's first line, with the token and any part of it cut out: some google-auth
    messages quote the token they could not parse."""
    text = (str(error).splitlines() or [type(error).__name__])[0]
    for secret in sorted([token, *token.split(".")], key=len, reverse=True):
        if len(secret) >= 8:
            text = text.replace(secret, "<redacted>")
    return text[:200]
