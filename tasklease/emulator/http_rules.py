"""What Cloud Tasks and Cloud Scheduler refuse in an HTTP request they are asked to send. Pure.

From the HttpRequest (Cloud Tasks v2) and HttpTarget (Cloud Scheduler v1) field docs, in the
installed clients' ``types/target.py``: the URL is at most 2083 characters after encoding;
the headers total less than 80 KB; a body only with POST, PUT or PATCH. A header that HTTP/1.1
cannot carry (a name that is not a token, a value with CR, LF or NUL, or characters outside
Latin-1, which http.client encodes header values in) is refused at creation with
INVALID_ARGUMENT, as the services refuse it, rather than failing every attempt to send it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote

from tasklease.emulator.errors import ApiError

MAX_URL_CHARACTERS = 2083
MAX_HEADER_BYTES = 80 * 1024
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# RFC 9110 section 5.6.2: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", re.ASCII)
_BAD_VALUE = re.compile(r"[\r\n\0]")
# What percent-encoding leaves alone in a URL (RFC 3986 reserved and unreserved characters).
_URL_SAFE = ":/?#[]@!$&'()*+,;=%~-._"


def check_request(
    field: str, url: str, method: str, headers: Mapping[str, str], body_bytes: int
) -> None:
    """Raise INVALID_ARGUMENT for what the service refuses in this request; ``field`` names
    it in the message (``task.httpRequest``, ``job.httpTarget``)."""
    if len(quote(url, safe=_URL_SAFE)) > MAX_URL_CHARACTERS:
        raise ApiError(
            400, f"{field}.url is longer than {MAX_URL_CHARACTERS} characters after encoding"
        )
    if body_bytes and method not in BODY_METHODS:
        raise ApiError(400, f"{field}.body is allowed only with POST, PUT or PATCH, not {method}")
    check_headers(field, headers)


def check_headers(field: str, headers: Mapping[str, str]) -> None:
    """Raise INVALID_ARGUMENT for headers that cannot be sent, or 80 KB of them or more."""
    total = 0
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise ApiError(400, f"{field}.headers: {name!r} is not a valid header name")
        if _BAD_VALUE.search(value):
            raise ApiError(
                400, f"{field}.headers: the value of {name} contains a line break or NUL"
            )
        try:
            encoded = value.encode("latin-1")
        except UnicodeEncodeError:
            raise ApiError(
                400, f"{field}.headers: the value of {name} has characters outside Latin-1"
            ) from None
        total += len(name) + len(encoded)
    if total >= MAX_HEADER_BYTES:
        raise ApiError(400, f"{field}.headers must total less than 80KB")
