"""Where the relay may send an outbox entry, and with which token.

An entry is a row of the caller's database: whoever can insert one could otherwise have the
relay ask Cloud Tasks for an OIDC token of the invoker account, with an audience of their
choice, delivered to a URL of their choice. So the relay sends an entry only when its URL is
under the worker's URL (``TASKLEASE_WORKER_URL``) or a prefix of
``TASKLEASE_OUTBOX_ALLOWED_URLS``, and its token only for the configured audience (or an
audience under those URLs, which only the worker accepts) and the configured account. Anything
else is marked failed with the reason. No I/O here.

A prefix matches on scheme, host and port exactly and on whole path segments:
``https://w.run.app`` covers ``https://w.run.app/tasks/x`` but neither
``https://w.run.app.evil.com`` nor ``https://w.run.app@evil.com``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote, urlsplit

from tasklease.errors import ConfigurationError
from tasklease.producer.transport import TaskRequest

ENV_WORKER_URL = "TASKLEASE_WORKER_URL"
ENV_ALLOWED_URLS = "TASKLEASE_OUTBOX_ALLOWED_URLS"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SHOWN_CHARS = 200  # The most of an entry's URL or audience quoted in a refusal.


class ProducerSettings(Protocol):
    """What the destinations are read from: a :class:`~tasklease.producer.Producer` fits."""

    worker_url: str
    audience: str | None
    service_account: str | None


class NoWorkerURL(ConfigurationError):
    """The relay has no worker URL, so no entry could be checked: it sends nothing."""

    def __init__(self) -> None:
        super().__init__(
            f"set {ENV_WORKER_URL} to the worker's URL: the outbox relay sends entries only to "
            f"URLs under it (and under the prefixes of {ENV_ALLOWED_URLS})"
        )


@dataclass(frozen=True)
class _Place:
    """A URL cut into what a prefix compares: scheme, host and port exactly, path by segment."""

    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]

    def under(self, prefix: _Place) -> bool:
        return (self.scheme, self.host, self.port) == (
            prefix.scheme,
            prefix.host,
            prefix.port,
        ) and self.segments[: len(prefix.segments)] == prefix.segments


def _place(url: str) -> _Place | str:
    """``url`` as a place, or why it cannot be compared safely (no guessing at how another
    parser would read it)."""
    if not isinstance(url, str) or not url:
        return "it is empty"
    if not all(33 <= ord(ch) < 127 for ch in url) or "\\" in url:
        return "it has a space, a backslash, a control or a non-ASCII character"
    try:
        parts = urlsplit(url)
    except ValueError:  # A '[' or ']' it cannot read as an IPv6 host.
        return "its host is not a name nor a valid [IPv6] address"
    if parts.scheme.lower() not in _DEFAULT_PORTS:
        return "it is not an http(s) URL"
    if "@" in parts.netloc:
        return "it has a user part (user@host)"
    if parts.fragment or url.endswith("#"):
        return "it has a fragment (#)"
    try:
        port = parts.port
    except ValueError:
        return "its port is not a number"
    if not parts.hostname:
        return "it has no host"
    segments = tuple(segment for segment in parts.path.split("/") if segment)
    for segment in segments:
        if unquote(segment) in (".", "..") or any(ch in unquote(segment) for ch in "/\\"):
            return "its path has a '.' or '..' segment or an encoded slash"
    scheme = parts.scheme.lower()
    return _Place(scheme, parts.hostname, port or _DEFAULT_PORTS[scheme], segments)


def _prefix(url: str, setting: str) -> _Place:
    place = _place(url.strip())
    if isinstance(place, str):
        raise ConfigurationError(
            f"{setting}: {url!r} cannot be an outbox prefix: {place}; give http(s)://HOST[:PORT]"
            "[/PATH] URLs"
        )
    if urlsplit(url.strip()).query:
        raise ConfigurationError(
            f"{setting}: {url!r} cannot be an outbox prefix: it has a query (?)"
        )
    return place


def _shown(value: object) -> str:
    """``value`` quoted for a refusal, cut short; any type (a row's field may hold one)."""
    text = value if isinstance(value, str) else repr(value)
    return repr(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")


@dataclass(frozen=True)
class Destinations:
    """The URLs, audiences and account the relay sends entries with; anything else refused."""

    prefixes: tuple[_Place, ...]
    audiences: frozenset[str]
    service_account: str | None = None

    @classmethod
    def configured(
        cls,
        worker_url: str | None,
        *,
        audience: str | None = None,
        service_account: str | None = None,
        allowed_urls: str | Iterable[str] | None = None,
    ) -> Destinations:
        """From the producer's settings (``TASKLEASE_WORKER_URL``, its audience and account)
        and ``TASKLEASE_OUTBOX_ALLOWED_URLS`` (comma-separated); :class:`NoWorkerURL` without
        a worker URL, a ``ConfigurationError`` naming the setting for a prefix that is not one."""
        if not worker_url:
            raise NoWorkerURL
        extra = allowed_urls.split(",") if isinstance(allowed_urls, str) else allowed_urls or ()
        extra_prefixes = [_prefix(url, ENV_ALLOWED_URLS) for url in extra if url.strip()]
        prefixes = (_prefix(worker_url, ENV_WORKER_URL), *extra_prefixes)
        return cls(prefixes, frozenset({audience} if audience else ()), service_account or None)

    def _allowed_url(self, url: str) -> str | None:
        """None when ``url`` is under a prefix, else why not."""
        place = _place(url)
        if isinstance(place, str):
            return place
        if any(place.under(prefix) for prefix in self.prefixes):
            return None
        return f"it is not under {ENV_WORKER_URL} or a prefix of {ENV_ALLOWED_URLS}"

    def refusal(self, request: TaskRequest) -> str | None:
        """None when the relay may send ``request``; else the reason it is marked failed."""
        why = self._allowed_url(request.url)
        if why is not None:
            return f"refused to send to URL {_shown(request.url)}: {why}"
        if request.service_account is None:
            return None  # No token: its audience is never used.
        if self.service_account is not None and request.service_account != self.service_account:
            return (
                f"refused to send with a token of {_shown(request.service_account)}: the relay "
                f"signs only as TASKLEASE_SERVICE_ACCOUNT ({self.service_account})"
            )
        audience = request.audience
        # No audience: Cloud Tasks uses the task's URL, checked above.
        if not audience or audience in self.audiences or self._allowed_url(audience) is None:
            return None
        return (
            f"refused to send with a token for audience {_shown(audience)}: it is not "
            f"TASKLEASE_AUDIENCE nor under {ENV_WORKER_URL} or a prefix of {ENV_ALLOWED_URLS}"
        )


def for_producer(
    producer: ProducerSettings, environ: Mapping[str, str] | None = None
) -> Destinations:
    """The destinations of a relay sending through ``producer``: its worker URL, audience and
    account, and the prefixes of ``TASKLEASE_OUTBOX_ALLOWED_URLS`` in ``environ``."""
    env = os.environ if environ is None else environ
    return Destinations.configured(
        producer.worker_url,
        audience=producer.audience,
        service_account=producer.service_account,
        allowed_urls=env.get(ENV_ALLOWED_URLS),
    )
