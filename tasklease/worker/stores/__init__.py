"""Lease stores: the contract (runs, and the lock and operator-query capabilities), its
backends, and the store URL that picks one."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tasklease import protocol
from tasklease.errors import ConfigurationError
from tasklease.lazy import lazy_exports
from tasklease.plumbing.url_secrets import shown_url
from tasklease.worker.core import constants as c
from tasklease.worker.stores.base.codec import RecordCodec
from tasklease.worker.stores.base.locks import LockStore
from tasklease.worker.stores.base.queries import OperatorQueries
from tasklease.worker.stores.base.store import (
    Change,
    LeaseStore,
    LockChange,
    Moment,
    RunReader,
    Update,
    resolve,
)
from tasklease.worker.stores.base.tally import TALLY_KEPT, DeliveryTally, MinuteCounts, TallyKey
from tasklease.worker.stores.base.transactional import (
    StepWork,
    TransactionalStore,
    TransactionOutcome,
    Work,
)

if TYPE_CHECKING:
    from tasklease.worker.stores.firestore.store import FirestoreStore
    from tasklease.worker.stores.memory.store import MemoryStore
    from tasklease.worker.stores.postgres.store import PostgresStore
    from tasklease.worker.stores.spanner.store import SpannerStore
    from tasklease.worker.stores.sqlite.store import SqliteStore

# Beside the stores: what a store of one's own subclasses and the types of its primitives
# ("Writing a store" in the README), so it imports from here alone, whatever the layout.
__all__ = [
    "TALLY_KEPT",
    "Change",
    "DeliveryTally",
    "FirestoreStore",
    "LeaseStore",
    "LockChange",
    "LockStore",
    "MemoryStore",
    "MinuteCounts",
    "Moment",
    "OperatorQueries",
    "PostgresStore",
    "RecordCodec",
    "RunReader",
    "SpannerStore",
    "SqliteStore",
    "StepWork",
    "TallyKey",
    "TransactionOutcome",
    "TransactionalStore",
    "Update",
    "Work",
    "check_store_is_shared",
    "resolve",
    "store_from_url",
]


def check_store_is_shared(store: LeaseStore, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a store that lives on one instance's disk or memory where instances are many.

    On Cloud Run (``K_SERVICE`` set) instances share no disk (docs/platform-facts.md): with a
    SQLite or in-memory store, two instances that each receive one duplicate would both run
    it. ``TASKLEASE_ALLOW_LOCAL_STORE=1`` overrides this, e.g. for a service capped at one
    instance that accepts losing its records on every restart.
    """
    environ = os.environ if environ is None else environ
    if store.shared_across_instances:
        return
    service = environ.get(protocol.ENV_CLOUD_RUN_SERVICE)
    if not service or environ.get(protocol.ENV_ALLOW_LOCAL_STORE) == "1":
        return
    raise ConfigurationError(
        f"{store!r} keeps runs on this instance only, but this is Cloud Run service "
        f"{service!r} ({protocol.ENV_CLOUD_RUN_SERVICE} is set), whose instances share no disk: a "
        "duplicate reaching two instances would run twice. Set "
        f"{protocol.ENV_STORE}=firestore://?collection=tasklease_runs (pip install "
        f"'tasklease[firestore]'), or {protocol.ENV_ALLOW_LOCAL_STORE}=1 to accept the risk."
    )


def store_from_url(url: str | None = None) -> LeaseStore:
    """Build a store from a URL, or from ``TASKLEASE_STORE`` (default: a SQLite file).

    - ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``
    - ``memory://``
    - ``firestore://?collection=tasklease_runs&database=(default)`` (project from
      ``GOOGLE_CLOUD_PROJECT``; needs ``tasklease[firestore]``)
    - ``postgresql://user:password@host:5432/db?schema=tasklease`` (or ``postgres://``;
      options in :mod:`tasklease.worker.stores.postgres.options`; needs
      ``tasklease[postgres]``)
    - ``spanner://projects/P/instances/I/databases/D?table=tasklease_runs&call_timeout=10``
      (needs ``tasklease[spanner]``)
    """
    url = url or os.environ.get(protocol.ENV_STORE) or c.DEFAULT_STORE_URL
    scheme, _, rest = url.partition("://")
    if scheme == "memory":
        from tasklease.worker.stores.memory.store import MemoryStore  # noqa: PLC0415 - on use only.

        return MemoryStore()
    if scheme == "sqlite":
        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise ConfigurationError(
                f"store URL {shown_url(url)!r} names no file: use sqlite:///runs.db"
            )
        from tasklease.worker.stores.sqlite.store import SqliteStore  # noqa: PLC0415 - on use only.

        return SqliteStore(path)
    if scheme == "firestore":
        options = {key: values[-1] for key, values in parse_qs(urlsplit(url).query).items()}
        unknown = set(options) - {"collection", "database", "project", "call_timeout"}
        if unknown:
            raise ConfigurationError(
                f"store URL {shown_url(url)!r}: unknown options {sorted(unknown)}"
            )
        timeout = options.pop("call_timeout", None)
        return _firestore_store().from_options(
            **options, call_timeout=float(timeout) if timeout else None
        )
    if scheme in ("postgresql", "postgres"):
        return _postgres_store().from_url(url)
    if scheme == "spanner":
        return _spanner_store_from_url(url)
    raise ConfigurationError(
        f"unknown store URL {shown_url(url)!r}: use sqlite:///path, memory://, firestore://, "
        "postgresql:// or spanner://"
    )


def _spanner_store_from_url(url: str) -> LeaseStore:
    parts = urlsplit(url)
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(options) - {"table", "call_timeout"}
    if unknown:
        raise ConfigurationError(f"store URL {shown_url(url)!r}: unknown options {sorted(unknown)}")
    database = f"{parts.netloc}{parts.path}".strip("/")
    store = _spanner_store()
    timeout = options.get("call_timeout")
    return store(
        database,
        options.get("table", store.DEFAULT_TABLE),
        call_timeout=float(timeout) if timeout else store.DEFAULT_CALL_TIMEOUT,
    )


def _firestore_store() -> type[FirestoreStore]:
    try:
        from tasklease.worker.stores.firestore.store import FirestoreStore  # noqa: PLC0415 - optional extra.
    except ImportError as exc:
        raise ConfigurationError(
            "the Firestore store needs google-cloud-firestore: pip install 'tasklease[firestore]'"
        ) from exc
    return FirestoreStore


def _postgres_store() -> type[PostgresStore]:
    try:
        from tasklease.worker.stores.postgres.store import PostgresStore  # noqa: PLC0415 - optional extra.
    except ImportError as exc:
        raise ConfigurationError(
            "the Postgres store needs psycopg 3 and psycopg_pool: pip install 'tasklease[postgres]'"
        ) from exc
    return PostgresStore


def _spanner_store() -> type[SpannerStore]:
    try:
        from tasklease.worker.stores.spanner.store import SpannerStore  # noqa: PLC0415 - optional extra.
    except ImportError as exc:
        raise ConfigurationError(
            "the Spanner store needs google-cloud-spanner: pip install 'tasklease[spanner]'"
        ) from exc
    return SpannerStore


# Each store is imported when it is first named, so a worker loads only the one it uses.
_lazy_getattr, __dir__ = lazy_exports(
    __name__,
    {
        "MemoryStore": "tasklease.worker.stores.memory.store",
        "SqliteStore": "tasklease.worker.stores.sqlite.store",
    },
)


def __getattr__(name: str) -> Any:
    # Firestore and Postgres need optional extras: imported on first use, with an install hint.
    if name == "FirestoreStore":
        return _firestore_store()
    if name == "PostgresStore":
        return _postgres_store()

    # Firestore and Spanner need optional extras: imported on first use, with an install hint.
    if name == "FirestoreStore":
        return _firestore_store()
    if name == "SpannerStore":
        return _spanner_store()
    return _lazy_getattr(name)
