"""Databases created before durable steps gain their two columns when a store opens them,
and keep the runs they hold."""

from __future__ import annotations

from tasklease.testing.contract_support import T0, claim_request
from tasklease.worker.core import steps
from tasklease.worker.core.steps import StepRecord
from tasklease.worker.stores.postgres.schema import SCHEMA_VERSION
from tests.support import postgres as postgres_support


def _step() -> StepRecord:
    return StepRecord("a", "1", "attempt-1", T0, 1)


def test_a_version_1_postgres_schema_is_migrated_and_keeps_its_runs(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    from tasklease.worker.stores.postgres.store import PostgresStore  # noqa: PLC0415

    schema = postgres_support.fresh_schema()
    url = postgres_cluster.url(schema=schema)
    store = PostgresStore.from_url(url)
    store.claim(claim_request(), T0)
    store.close()
    # As version 1 left it: no step columns.
    postgres_cluster.sql(
        f"ALTER TABLE {schema}.runs DROP COLUMN steps_json, DROP COLUMN continuation_json"
    )
    postgres_cluster.sql(f"DROP TABLE {schema}.delivery_tally")
    postgres_cluster.sql(f"UPDATE {schema}.schema_version SET version = 1")
    reopened = PostgresStore.from_url(url)
    assert reopened.record_step("run-1", "attempt-1", _step()) is not None
    record = reopened.get("run-1")
    reopened.close()
    assert record is not None and list(steps.steps_of(record)) == ["a"]
    version = postgres_cluster.sql(f"SELECT version FROM {schema}.schema_version")
    assert version == [(SCHEMA_VERSION,)]


def test_a_spanner_table_without_the_step_columns_gains_them(spanner_database: str) -> None:
    from google.cloud import spanner  # noqa: PLC0415

    from tasklease.worker.stores.spanner import schema as spanner_schema  # noqa: PLC0415
    from tasklease.worker.stores.spanner.store import DEFAULT_TABLE, SpannerStore  # noqa: PLC0415

    _, project, _, instance, _, database_id = spanner_database.split("/")
    database = spanner.Client(project=project).instance(instance)  # type: ignore[no-untyped-call]
    old = [
        "\n".join(
            line
            for line in statement.splitlines()
            if "steps_json" not in line and "continuation_json" not in line
        )
        for statement in spanner_schema.ddl(DEFAULT_TABLE)
    ]
    database.database(database_id).update_ddl(old).result(120)
    store = SpannerStore(spanner_database)
    try:
        store.claim(claim_request(), T0)
        assert store.record_step("run-1", "attempt-1", _step()) is not None
        record = store.get("run-1")
    finally:
        store.close()
    assert record is not None and list(steps.steps_of(record)) == ["a"]
