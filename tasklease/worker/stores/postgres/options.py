"""The Postgres store's options, and the store URL they are read from.

``postgresql://USER:PASSWORD@HOST:PORT/DB?schema=tasklease&max_size=10&statement_timeout=5``
(``postgres://`` too). The options below are the store's; every other query parameter is
libpq's and passed on, e.g. ``host=/cloudsql/PROJECT:REGION:INSTANCE`` for Cloud SQL's Unix
socket on Cloud Run, or ``sslmode=require``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tasklease.errors import ConfigurationError
from tasklease.plumbing.postgres_names import checked_schema
from tasklease.plumbing.url_secrets import POSTGRES_SCHEMES, scrubbed, shown_url, split_options
from tasklease.worker.stores.postgres.schema import DEFAULT_SCHEMA

_ON = {"1", "on", "true", "yes"}
_OFF = {"0", "off", "false", "no"}
# A call past the server's own statement_timeout by this much is cut by the client.
_CLIENT_MARGIN = 1.0


@dataclass(frozen=True)
class Options:
    """How the store talks to its database.

    - ``schema``: the Postgres schema holding the tables (created if missing).
    - ``min_size`` / ``max_size``: the connection pool of each process (bounded).
    - ``statement_timeout``: seconds the server may spend on one statement; a call the server
      does not answer at all is cut one second later (``call_timeout``).
    - ``pool_timeout``: seconds a call waits for a free or new connection.
    - ``server_clock``: given a clock, use the database server's instead (see the store).
    - ``purge_interval``: how often a claiming process purges expired records, in batches of
      ``purge_batch`` rows.
    - ``group_commit``: send the claims and finishes of one process's concurrent requests in
      one transaction (:mod:`~tasklease.worker.stores.postgres.group_commit`); off, each is
      its own.
    """

    schema: str = DEFAULT_SCHEMA
    min_size: int = 1
    max_size: int = 10
    statement_timeout: float = 5.0
    pool_timeout: float = 5.0
    server_clock: bool = True
    purge_interval: timedelta = timedelta(minutes=10)
    purge_batch: int = 1000
    group_commit: bool = True

    def __post_init__(self) -> None:
        checked_schema(self.schema)
        if not 0 <= self.min_size <= self.max_size or self.max_size < 1:
            raise ConfigurationError(
                f"Postgres pool: need 0 <= min_size <= max_size, max_size >= 1 "
                f"(got {self.min_size}, {self.max_size})"
            )
        if self.statement_timeout <= 0 or self.pool_timeout <= 0 or self.purge_batch < 1:
            raise ConfigurationError("Postgres timeouts and purge_batch must be positive")

    @property
    def call_timeout(self) -> float:
        """The client's bound on one call: the server's own, and a margin."""
        return self.statement_timeout + _CLIENT_MARGIN

    @property
    def idle_in_transaction(self) -> float:
        """How long a transaction may sit idle before it is ended (rolled back): the
        server's bound after its last statement, and the client's for a pipelined
        transaction, which the server never sees idle (while no call waits for the server,
        counted from the end of the last one)."""
        return 2 * self.call_timeout

    @classmethod
    def from_url(cls, url: str) -> tuple[str, Options]:
        """The libpq URL (the store's own options taken out) and the options."""
        if url.partition("://")[0] not in POSTGRES_SCHEMES:
            raise ConfigurationError(f"not a Postgres URL: {shown_url(url)!r}")
        names = {f.name: f for f in dataclasses.fields(cls)}
        # Cut as libpq reads it: a password's unencoded "?" or "#" is no query.
        conninfo, options = split_options(url, names)
        ours = {key: _parse(key, value, names[key].type) for key, value in options}
        try:
            return conninfo, cls(**ours)
        except TypeError as exc:  # pragma: no cover - every field has a parser
            raise ConfigurationError(f"store URL {shown_url(url)!r}: {exc}") from exc

    def libpq(self, conninfo: str) -> str:
        """``conninfo`` with the session settings the store relies on added."""
        try:
            params = conninfo_to_dict(conninfo)
        except Exception as exc:  # psycopg.ProgrammingError: a malformed conninfo.
            # libpq's message quotes the token it could not read, the password included.
            reason = scrubbed(str(exc).strip(), conninfo)
            raise ConfigurationError(
                f"Postgres connection string {shown_url(conninfo)!r}: {reason}"
            ) from None
        settings = (
            f"-c statement_timeout={int(self.statement_timeout * 1000)} "
            f"-c idle_in_transaction_session_timeout={int(self.idle_in_transaction * 1000)} "
            "-c TimeZone=UTC"
        )
        params["options"] = f"{params.get('options', '')} {settings}".strip()
        params.setdefault("application_name", "tasklease")
        params.setdefault("connect_timeout", str(max(2, round(self.pool_timeout))))
        return make_conninfo("", **params)

    def describe(self, conninfo: str) -> str:
        """Where the store is, without its password."""
        params = conninfo_to_dict(conninfo)
        shown = {k: params[k] for k in ("host", "port", "dbname", "user") if k in params}
        return ", ".join([*(f"{k}={v!r}" for k, v in shown.items()), f"schema={self.schema!r}"])


def _parse(key: str, value: str, kind: Any) -> Any:
    kind = str(kind)
    try:
        if "bool" in kind:
            if value.lower() not in _ON | _OFF:
                raise ValueError(value)
            return value.lower() in _ON
        if "timedelta" in kind:
            return timedelta(seconds=float(value))
        if "int" in kind:
            return int(value)
        if "float" in kind:
            return float(value)
    except ValueError:
        raise ConfigurationError(f"Postgres store option {key}={value!r} is not valid") from None
    return value
