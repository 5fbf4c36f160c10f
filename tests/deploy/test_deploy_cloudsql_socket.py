"""The Postgres URL the deploy kit gives a Cloud Run worker, against a real server: the Unix
socket in a folder named like Cloud Run's ``/cloudsql/PROJECT:REGION:INSTANCE`` (colons, no
port: libpq's default 5432), and the password only in ``PGPASSWORD``, as ``--set-secrets``
mounts it. The private cluster (tests/support/postgres.py) requires that password of the
kit's user on local sockets."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tasklease.deploy.stores import PASSWORD_ENV, Postgres
from tasklease.errors import StoreUnavailable
from tasklease.worker.core.records import ClaimRequest, Verdict
from tasklease.worker.stores import store_from_url
from tests.support import postgres as postgres_support

INSTANCE = "my-project:us-central1:main-db"
PASSWORD = "s3cret-from-secret-manager"


@pytest.fixture
def cloudsql(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cluster whose user ``tasklease`` must give its password on the socket, reachable at
    ``ROOT/cloudsql/INSTANCE/.s.PGSQL.5432``; yields ROOT."""
    with postgres_support.running_cluster() as cluster:
        cluster.sql(f"CREATE ROLE tasklease LOGIN PASSWORD '{PASSWORD}'")
        cluster.sql("CREATE DATABASE appdb OWNER tasklease")
        hba = cluster.data / "pg_hba.conf"
        hba.write_text("local all tasklease scram-sha-256\n" + hba.read_text())
        cluster.sql("SELECT pg_reload_conf()")
        with tempfile.TemporaryDirectory() as root:
            socket_dir = Path(root, "cloudsql", INSTANCE)
            socket_dir.mkdir(parents=True)
            (socket_dir / ".s.PGSQL.5432").symlink_to(cluster.sockets / f".s.PGSQL.{cluster.port}")
            monkeypatch.delenv(PASSWORD_ENV, raising=False)
            for name in ("PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSFILE"):
                monkeypatch.delenv(name, raising=False)
            yield Path(root)


def kit_url(root: Path) -> str:
    """The URL the kit sets, its /cloudsql folder moved under ``root`` (Cloud Run's is /)."""
    url = Postgres(INSTANCE, "appdb", "tasklease", "tasklease-db-password").url
    assert url == f"postgresql://tasklease@/appdb?host=/cloudsql/{INSTANCE}"
    return url.replace("host=/cloudsql/", f"host={root}/cloudsql/")


def test_the_kits_url_claims_a_run_through_the_socket_with_the_mounted_password(
    cloudsql: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    store = store_from_url(kit_url(cloudsql) + "&statement_timeout=5")
    try:
        request = ClaimRequest(
            "run-1", "task", "work", "attempt-1", timedelta(seconds=30), timedelta(days=1)
        )
        claimed = store.claim(request, datetime.now(UTC))
        assert claimed.verdict is Verdict.CLAIMED
        assert claimed.record.attempt_id == "attempt-1"
        stored = store.get("run-1")
        assert stored is not None and stored.attempt_id == "attempt-1"
    finally:
        store.close()


def test_without_the_mounted_password_the_store_is_unavailable_and_the_log_says_why(
    cloudsql: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server refuses the user (so the first test's claim used the password); the store
    answers StoreUnavailable (a 503, retried), and psycopg's pool logs the server's reason."""
    assert PASSWORD_ENV not in os.environ
    store = store_from_url(kit_url(cloudsql) + "&pool_timeout=2")
    try:
        with pytest.raises(StoreUnavailable):
            store.get("run-1")
    finally:
        store.close()
    assert "no password supplied" in caplog.text
