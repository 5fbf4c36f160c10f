"""Following a target's redirect within one attempt. Pure.

Cloud Tasks' HttpRequest.url docs: "The Location header response from a redirect response
[300 - 399] may be followed. The redirect is not counted as a separate attempt." Cloud
Scheduler's HttpTarget docs: "For a redirected request, the response returned by the
redirected request is considered." Here a redirect is followed to the same scheme only (an
``http`` target never moves an attempt, and its token, onto TLS or off it), at most
:data:`MAX_REDIRECTS` times. Method and body change as Go's net/http client changes them
(301, 302 and 303 become a GET without a body unless HEAD; 307 and 308 keep both), and the
Authorization header goes only to the same host.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

MAX_REDIRECTS = 5
_FOLLOWED = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True)
class Hop:
    """The request after a redirect."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes


def next_hop(
    status: int,
    location: str | None,
    *,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    hops: int,
) -> Hop | None:
    """The request that follows answer ``status`` to ``url`` (after ``hops`` redirects), or
    None: not a redirect, no Location, too many, or to another scheme."""
    if status not in _FOLLOWED or not location or hops >= MAX_REDIRECTS:
        return None
    try:
        target = urljoin(url, location.strip())
        old, new = urlsplit(url), urlsplit(target)
    except ValueError:
        return None
    if new.scheme.lower() != old.scheme.lower() or not new.hostname:
        return None
    kept = dict(headers)
    if status in (301, 302, 303) and method != "HEAD":
        method, body = "GET", b""
        for name in [n for n in kept if n.lower() == "content-type"]:
            del kept[name]
    if (new.hostname, new.port) != (old.hostname, old.port):
        for name in [n for n in kept if n.lower() == "authorization"]:
            del kept[name]
    return Hop(method, target.split("#", 1)[0], kept, body)
