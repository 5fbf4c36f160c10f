"""Fetching the public keys that OIDC ID tokens are verified against.

google-auth fetches the keys on every verification, with a 120 s timeout, and remembers
nothing when a fetch fails: a hanging key server holds each request for two minutes, and a
stream of junk tokens turns into a stream of fetches against a server that is already failing.
:class:`KeyFetcher` is the transport google-auth gets instead: an HTTP cache that honours
``Cache-Control`` for the keys, a bounded timeout, and a short memory of failures.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import cachecontrol
import google.auth.exceptions
import google.auth.transport
import google.auth.transport.requests
import requests

from tasklease.worker.core.constants import FETCH_TIMEOUT_SECONDS

_log = logging.getLogger("tasklease.auth")

# Seconds a failed fetch is remembered: requests meanwhile get 503 without fetching again.
FAILURE_CACHE_SECONDS = 5.0


class KeyFetcher(google.auth.transport.Request):
    """A google-auth transport for key fetches: cached, bounded, failures remembered."""

    def __init__(
        self,
        session: requests.Session | None = None,
        *,
        timeout: float = FETCH_TIMEOUT_SECONDS,
        failure_ttl: float = FAILURE_CACHE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._request = google.auth.transport.requests.Request(
            session=session or cachecontrol.CacheControl(requests.Session())
        )
        self.timeout = timeout
        self.failure_ttl = failure_ttl
        self._monotonic = monotonic
        self._failed: dict[str, tuple[float, str]] = {}  # url -> (until, why)
        # One fetch at a time: when the server fails, the requests queued behind the fetch
        # see the remembered failure instead of trying again one after another.
        self._lock = threading.Lock()

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> google.auth.transport.Response:
        with self._lock:
            failed = self._failed.get(url)
            if failed and self._monotonic() < failed[0]:
                why = f"{failed[1]} (remembered)"
                raise google.auth.exceptions.TransportError(why)  # type: ignore[no-untyped-call]
            bounded = min(timeout or self.timeout, self.timeout)
            try:
                response: google.auth.transport.Response = self._request(
                    url, method, body, headers, bounded, **kwargs
                )
            except google.auth.exceptions.TransportError as exc:
                self._remember(url, f"fetching {url} failed: {exc}")
                raise
            if response.status != 200:
                self._remember(url, f"{url} answered HTTP {response.status}")
            else:
                self._failed.pop(url, None)
            return response

    def _remember(self, url: str, why: str) -> None:
        _log.error("could not fetch the OIDC public keys: %s", why)
        self._failed[url] = (self._monotonic() + self.failure_ttl, why)
