"""On Postgres ``ctx.transaction`` is a pooled connection, and ``SET`` (or
``set_config(..., false)``) inside a transaction sets the *session*: once the transaction
commits, the setting stays on the connection, and the next run the pool gives it to starts
with it. The usual one is the tenant of row-level security (``SET app.tenant = '...'``): the
next tenant's handler then reads and writes as the previous tenant. What a handler sets
lasts for its own transaction, as on a connection of its own."""

from __future__ import annotations

from typing import Any

import pytest

from tasklease.worker import Router, TaskContext, create_app
from tasklease.worker.stores.postgres.store import PostgresStore
from tests.support.helpers import task_headers

pytestmark = pytest.mark.service


def test_a_setting_one_handler_sets_is_not_the_next_runs_on_the_same_connection(
    postgres_url: str,
) -> None:
    # One pooled connection: the second run is served by the one the first one set.
    store = PostgresStore.from_url(f"{postgres_url}&min_size=1&max_size=1")
    router = Router()

    @router.task("tenant", transactional=True)
    def tenant(payload: Any, ctx: TaskContext) -> Any:
        seen = ctx.transaction.execute("SELECT current_setting('app.tenant', true)").fetchone()
        if payload.get("tenant"):
            ctx.transaction.execute(
                "SELECT set_config('app.tenant', %s, false)", [payload["tenant"]]
            )
        return seen[0]

    client = create_app(router, store=store, auth="none").test_client()
    try:
        answers = [
            client.post(
                "/tasks/tenant", headers=task_headers(task=f"t-{n}"), json=payload
            ).get_json()
            for n, payload in enumerate(({"tenant": "acme"}, {}))
        ]
    finally:
        store.close()
    assert [answer["outcome"] for answer in answers] == ["processed", "processed"]
    assert answers[1].get("result") in ("", None)
