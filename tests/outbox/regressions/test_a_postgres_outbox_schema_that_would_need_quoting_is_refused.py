"""Finding: the Postgres outbox put the URL's ``?schema=`` into ``SET search_path TO
"..."`` unchecked: a ``"`` in it ended the identifier, and the rest ran as SQL of its own
when the relay, ``tasklease outbox migrate`` or the dashboard opened the outbox. The store
refused the same option; both now check it alike."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tasklease.cli import main
from tasklease.errors import ConfigurationError
from tasklease.outbox import open_outbox
from tasklease.worker.stores import store_from_url
from tests.support import postgres as postgres_support

INJECTED = 'x"; CREATE TABLE public.injected_by_schema (); --'


def test_a_schema_with_a_quote_runs_no_sql_and_is_refused_as_the_store_refuses_it(
    postgres_cluster: postgres_support.Cluster,
) -> None:
    url = postgres_cluster.url(schema=quote(INJECTED))
    with pytest.raises(ConfigurationError) as outbox:
        open_outbox(url).close()
    assert postgres_cluster.sql("SELECT to_regclass('public.injected_by_schema')") == [(None,)]
    with pytest.raises(ConfigurationError) as store:
        store_from_url(url)
    assert str(outbox.value) == str(store.value)
    assert str(outbox.value).startswith(f"Postgres schema {INJECTED!r}: use [a-z_][a-z0-9_]*")


def test_the_cli_refuses_such_a_schema_in_one_line(
    postgres_cluster: postgres_support.Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    url = postgres_cluster.url(schema=quote(INJECTED))
    assert main(["outbox", "migrate", "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tasklease outbox: Postgres schema") and err.count("\n") == 1
    assert postgres_cluster.sql("SELECT to_regclass('public.injected_by_schema')") == [(None,)]
