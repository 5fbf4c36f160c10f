"""Where a deployed worker keeps its runs: ``store = "firestore" | "postgresql" | "spanner"``
in tasklease.toml, the ``[postgresql]`` and ``[spanner]`` tables, and the store URL each gives.

Cloud SQL from Cloud Run (cloud.google.com/sql/docs/postgres/connect-run): the service is
deployed with ``--add-cloudsql-instances PROJECT:REGION:INSTANCE``, Cloud Run mounts the
instance's Unix socket at ``/cloudsql/PROJECT:REGION:INSTANCE``, the runtime account needs
``roles/cloudsql.client``, and the database password comes from Secret Manager, mounted as an
environment variable with ``--set-secrets``: here ``PGPASSWORD``, which libpq reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STORES = ("firestore", "postgresql", "spanner")
# The environment variable libpq takes the password from (PostgreSQL docs, "Environment
# Variables"): the URL then holds no secret, and the secret is never in the service's config.
PASSWORD_ENV = "PGPASSWORD"  # noqa: S105 - a variable name, not a password.

_PROJECT = r"(?:[a-z][a-z0-9.-]{0,62}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]"
# Formats of the store tables' fields (Google's documented formats, or narrower): each reaches
# gcloud's command line, and the URL in --set-env-vars.
STORE_FORMATS: dict[str, tuple[str, str]] = {
    "postgresql.instance": (
        rf"{_PROJECT}:[a-z]+(?:-[a-z]+)+[0-9]{{1,2}}:[a-z](?:[a-z0-9-]{{0,61}}[a-z0-9])?",
        "an instance connection name PROJECT:REGION:INSTANCE",
    ),
    "postgresql.database": (r"[A-Za-z_][A-Za-z0-9_-]{0,62}", "a Postgres database name"),
    "postgresql.user": (r"[A-Za-z_][A-Za-z0-9_-]{0,62}", "a Postgres user name"),
    "postgresql.password_secret": (r"[A-Za-z0-9_-]{1,255}", "a Secret Manager secret ID"),
    "postgresql.password_version": (r"latest|[1-9][0-9]{0,9}", "latest or a version number"),
    "spanner.instance": (r"[a-z][a-z0-9-]{0,62}[a-z0-9]", "a Spanner instance ID"),
    "spanner.database": (r"[a-z][a-z0-9_-]{0,28}[a-z0-9]", "a Spanner database ID"),
}


@dataclass(frozen=True)
class Postgres:
    """A Cloud SQL for PostgreSQL database, reached through the socket Cloud Run mounts, with
    its user's password in a Secret Manager secret."""

    instance: str  # PROJECT:REGION:INSTANCE
    database: str
    user: str
    password_secret: str
    password_version: str = "latest"  # noqa: S105 - a secret version, not a password.

    @property
    def project(self) -> str:
        return self.instance.rsplit(":", 2)[0]

    @property
    def instance_id(self) -> str:
        return self.instance.rsplit(":", 1)[1]

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@/{self.database}?host=/cloudsql/{self.instance}"

    @property
    def secret_flag(self) -> str:
        return f"--set-secrets={PASSWORD_ENV}={self.password_secret}:{self.password_version}"


@dataclass(frozen=True)
class Spanner:
    """A Spanner database in the deploy's project (its instance exists; the database is
    created when missing; the store creates its tables and their row deletion policies)."""

    instance: str
    database: str

    def url(self, project: str) -> str:
        return f"spanner://projects/{project}/instances/{self.instance}/databases/{self.database}"


def load_postgres(table: Any) -> Postgres | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise TypeError("[postgresql] must be a table")
    unknown = sorted(
        set(table) - {"instance", "database", "user", "password_secret", "password_version"}
    )
    if unknown:
        raise ValueError(f"[postgresql]: unknown keys {unknown}")
    return Postgres(
        instance=table["instance"],
        database=table["database"],
        user=table["user"],
        password_secret=table["password_secret"],
        password_version=str(table.get("password_version", "latest")),
    )


def load_spanner(table: Any) -> Spanner | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise TypeError("[spanner] must be a table")
    unknown = sorted(set(table) - {"instance", "database"})
    if unknown:
        raise ValueError(f"[spanner]: unknown keys {unknown}")
    return Spanner(instance=table["instance"], database=table["database"])


def store_values(
    store: Any, postgres: Postgres | None, spanner: Spanner | None
) -> tuple[list[str], list[tuple[str, Any]]]:
    """The problems of the store choice, and each store field's (format name, value) to check."""
    if store not in STORES:
        return [f"store = {store!r} is not one of {', '.join(map(repr, STORES))}"], []
    if store == "postgresql" and postgres is None:
        return [
            'store = "postgresql" needs a [postgresql] table: instance, database, user, '
            "password_secret"
        ], []
    if store == "spanner" and spanner is None:
        return ['store = "spanner" needs a [spanner] table: instance, database'], []
    values: list[tuple[str, Any]] = []
    if postgres is not None:
        values += [
            ("postgresql.instance", postgres.instance),
            ("postgresql.database", postgres.database),
            ("postgresql.user", postgres.user),
            ("postgresql.password_secret", postgres.password_secret),
            ("postgresql.password_version", postgres.password_version),
        ]
    if spanner is not None:
        values += [("spanner.instance", spanner.instance), ("spanner.database", spanner.database)]
    return [], values
