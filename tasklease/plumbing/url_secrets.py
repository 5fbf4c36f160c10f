"""Database URLs as they may be shown: in pages, logs, errors and files others can read.

Every URL tasklease prints, logs or renders goes through :func:`shown_url`, and every
driver message that may quote one through :func:`scrubbed`. A Postgres URL is read the way
libpq reads it, not as a web URL: the user part ends at the first ``@`` before any ``/``, so
a password holding an unencoded ``#`` or ``?`` is still a password (``urlsplit`` would take
it for a fragment or a query and hide nothing); one holding a ``/`` (libpq then finds no user
part and does not log in) is hidden all the same; and the query is everything after the next
``?`` (libpq's ``conninfo_uri_parse_options``,
https://github.com/postgres/postgres/blob/master/src/interfaces/libpq/fe-connect.c). When
psycopg is installed, libpq's own parse of the URL is the final word on what its secrets are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from functools import cache
from urllib.parse import unquote

__all__ = ["MASK", "has_password", "scrubbed", "shown_url", "split_options"]

MASK = "***"
POSTGRES_SCHEMES = ("postgresql", "postgres")
# libpq's secret connection parameters (those PQconndefaults marks with dispchar "*" or
# "D"), and the usual names of secrets in the query of any other URL.
_SECRET_PARAMETERS = frozenset(
    {
        "password",
        "sslpassword",
        "oauth_client_secret",
        "scram_client_key",
        "scram_server_key",
        "passwd",
        "pwd",
        "secret",
        "token",
        "access_token",
        "api_key",
    }
)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# A libpq key/value connection string's secret: password=word or password='quoted \' word'.
_CONNINFO_SECRET = re.compile(
    r"(?:^|\s)(?P<key>\w+)\s*=\s*(?P<value>'(?:[^'\\]|\\.)*'|[^\s']+)", re.ASCII
)
# Secrets shorter than this are not cut out of a message (every "p" of it would go): a
# message quoting one is replaced as a whole.
_SHORTEST_SCRUBBED = 4


@dataclass(frozen=True)
class _Parts:
    """A ``scheme://`` URL cut the way libpq cuts it; every field is the raw text."""

    scheme: str
    user: str | None  # None: no user part (no "@" before the first "/").
    password: str | None  # None: no ":" in the user part.
    location: str  # Hosts, ports and path: up to the query.
    query: str | None  # None: no "?".

    def rebuilt(self, password: str | None, query: str | None) -> str:
        text = f"{self.scheme}://"
        if self.user is not None:
            text += self.user if password is None else f"{self.user}:{password}"
            text += "@"
        text += self.location
        return text if query is None else f"{text}?{query}"


def _split(url: str) -> _Parts | None:
    scheme, separator, rest = url.partition("://")
    if not separator or not _SCHEME.fullmatch(scheme):
        return None
    head = rest.split("/", 1)[0]
    # libpq ends the user part at the first "@"; elsewhere the last one hides the most.
    at = head.find("@") if scheme.lower() in POSTGRES_SCHEMES else head.rfind("@")
    if at < 0:
        # No user part to libpq, since a "/" comes first, as in a password with an unencoded
        # "/": such a URL does not log in, yet what stands before the last "@" ahead of the
        # query may still be the real password, so it is hidden as one. The cut changes
        # nothing that is rebuilt: the parts join back to the same text.
        query_at = rest.find("?")
        at = rest.rfind("@", 0, len(rest) if query_at < 0 else query_at)
    user = password = None
    if at >= 0:
        user, colon, secret = rest[:at].partition(":")
        password = secret if colon else None
        rest = rest[at + 1 :]
    location, question, query = rest.partition("?")
    return _Parts(scheme, user, password, location, query if question else None)


def _pairs(query: str) -> Iterator[tuple[str, str, str]]:
    """(raw pair, decoded key, raw value) of each ``&``-separated pair, as libpq splits them."""
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        yield pair, unquote(key).lower(), value


def shown_url(url: str) -> str:
    """``url`` without its secrets: a password in the user part or in the query (and, for
    a libpq key/value string, any ``password=``) becomes ``***``; the rest is kept as given."""
    parts = _split(url)
    if parts is None:
        shown, masked = _shown_conninfo(url), _own_secrets(url)
    else:
        query = parts.query
        if query is not None:
            query = "&".join(
                f"{pair.partition('=')[0]}={MASK}" if key in _secret_names() and value else pair
                for pair, key, value in _pairs(query)
            )
        shown, masked = parts.rebuilt(MASK if parts.password else None, query), _own_secrets(url)
    params = _libpq_params(url)
    if params is not None and not set(_libpq_secrets(params)) <= masked:
        # libpq reads a secret the cut above did not find: show only where it connects.
        return f"{parts.scheme if parts else 'postgresql'}://{MASK} " + _described(params)
    return shown


def has_password(url: str) -> bool:
    """Whether ``url`` carries a secret that :func:`shown_url` hides."""
    return bool(_secrets(url))


def scrubbed(text: str, *urls: str) -> str:
    """``text`` (a driver's error, a log line) with each of ``urls`` shown as
    :func:`shown_url` shows it and every literal secret of theirs cut out, wherever it
    appears (raw, percent-decoded or quoted as libpq quotes it)."""
    for url in urls:
        if url and url in text:
            text = text.replace(url, shown_url(url))
    secrets = sorted({s for url in urls for s in _secrets(url)}, key=len, reverse=True)
    for secret in secrets:
        if secret not in text:
            continue
        if len(secret) < _SHORTEST_SCRUBBED:
            where = ", ".join(shown_url(url) for url in urls if url)
            return f"(message not shown: it quotes a password of {where})"
        text = text.replace(secret, MASK)
    return text


def split_options(url: str, names: Collection[str]) -> tuple[str, list[tuple[str, str]]]:
    """``url`` without the query parameters in ``names`` (tasklease's own options, which
    libpq refuses), and those parameters, decoded, in order. The rest is kept as written, so
    libpq reads the URL as it would have: a password's ``?`` or ``#`` is not a query."""
    return _partition(url, lambda key: key in names)


def _partition(url: str, ours: Callable[[str], bool]) -> tuple[str, list[tuple[str, str]]]:
    parts = _split(url)
    if parts is None or parts.query is None:
        return url, []
    taken: list[tuple[str, str]] = []
    kept: list[str] = []
    for pair, key, value in _pairs(parts.query):
        if ours(key):
            taken.append((key, unquote(value)))
        elif pair:
            kept.append(pair)
    return parts.rebuilt(parts.password, "&".join(kept) if kept else None), taken


def _secrets(url: str) -> set[str]:
    """Every text of ``url`` that is a secret, in each form a message may quote it."""
    params = _libpq_params(url)
    found = _own_secrets(url) | (set() if params is None else set(_libpq_secrets(params)))
    for secret in list(found):
        found.add(secret.replace("\\", "\\\\").replace("'", "\\'"))  # make_conninfo's quoting.
    found.discard("")
    return found


def _own_secrets(url: str) -> set[str]:
    """The secrets of ``url`` as cut here, raw and percent-decoded."""
    found: set[str] = set()
    parts = _split(url)
    if parts is None:
        for match in _CONNINFO_SECRET.finditer(url):
            if match["key"].lower() in _secret_names():
                value = match["value"]
                found.add(value)
                if value.startswith("'"):
                    found.add(re.sub(r"\\(.)", r"\1", value[1:-1]))
    else:
        if parts.password:
            found.add(parts.password)
        for _, key, value in _pairs(parts.query or ""):
            if key in _secret_names() and value:
                found.add(value)
    return found | {unquote(secret) for secret in found}


def _shown_conninfo(text: str) -> str:
    def hide(match: re.Match[str]) -> str:
        if match["key"].lower() not in _secret_names():
            return match[0]
        return match[0][: match.start("value") - match.start()] + MASK

    return _CONNINFO_SECRET.sub(hide, text)


def _libpq_params(url: str) -> dict[str, str] | None:
    """libpq's own parse of a Postgres URL or key/value string; None when psycopg is not
    installed or libpq cannot read it (then the cut above is all there is)."""
    parts = _split(url)
    if parts is not None and parts.scheme.lower() not in POSTGRES_SCHEMES:
        return None
    try:
        from psycopg import Error  # noqa: PLC0415 - the postgres extra, optional here.
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415
    except ImportError:
        return None
    if parts is not None:
        # libpq refuses a query parameter it does not know (tasklease's schema=, ...).
        known = _libpq_keywords()
        url, _ = _partition(url, lambda key: key not in known)
    try:
        return {key: str(value) for key, value in conninfo_to_dict(url).items()}
    except Error:
        return None


def _libpq_secrets(params: dict[str, str]) -> list[str]:
    return [params[key] for key in _secret_names() if params.get(key)]


def _described(params: dict[str, str]) -> str:
    shown = [
        f"{key}={params[key]!r}" for key in ("host", "port", "dbname", "user") if key in params
    ]
    return f"({', '.join(shown)})"


@cache
def _libpq_keywords() -> frozenset[str]:
    try:
        from psycopg import pq  # noqa: PLC0415 - the postgres extra, optional here.
    except ImportError:
        return frozenset()
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


@cache
def _secret_names() -> frozenset[str]:
    try:
        from psycopg import pq  # noqa: PLC0415 - the postgres extra, optional here.
    except ImportError:
        return _SECRET_PARAMETERS
    libpq = {
        option.keyword.decode() for option in pq.Conninfo.get_defaults() if option.dispchar == b"*"
    }
    return _SECRET_PARAMETERS | libpq
