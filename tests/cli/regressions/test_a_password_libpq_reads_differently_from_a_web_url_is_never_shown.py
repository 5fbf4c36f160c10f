"""Finding: the outbox's password-hiding ``where()`` read the URL as a web URL. A ``#`` or
``?`` left unencoded in the password, which libpq reads as part of it (and logs in with),
made ``where()`` return the URL unchanged: on the dashboard's Outbox page and in
``tasklease outbox migrate``. A malformed ``%`` made libpq's error quote the password, and
that message reached the CLI, the relay thread's repeating log line, the dashboard's log and
the worker's start-up error (the store's ``ConfigurationError``)."""

from __future__ import annotations

import logging

import pytest

from tasklease.cli import main
from tasklease.errors import ConfigurationError
from tasklease.outbox import RelayThread
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import MemoryStore, store_from_url
from tests.support import postgres as postgres_support
from tests.support.outbox import producer

MARK = "Zq9w"  # In every password, and nowhere else: any output holding it leaks one.
LOGGING_IN = ["p#ss-" + MARK, "p?ss-" + MARK]  # libpq takes them whole, and logs in.
MALFORMED = "pa%zzss-" + MARK  # libpq refuses it, quoting the token in its error.


def url_with(cluster: postgres_support.Cluster, password: str) -> str:
    url = cluster.url(schema=postgres_support.fresh_schema())
    return url.replace("postgres@", f"postgres:{password}@", 1)


@pytest.mark.parametrize("password", LOGGING_IN)
def test_a_password_with_a_hash_or_question_mark_logs_in_and_is_never_shown(
    password: str,
    postgres_cluster: postgres_support.Cluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = url_with(postgres_cluster, password)
    monkeypatch.setenv("TASKLEASE_OUTBOX_URL", url)
    assert main(["outbox", "migrate"]) == 0
    assert main(["outbox", "status"]) == 0
    out, err = capsys.readouterr()
    assert "tasklease_outbox ready in postgresql://postgres:***@127.0.0.1" in out
    with caplog.at_level(logging.INFO):
        page = create_dashboard_app(MemoryStore(), outbox=url).test_client().get("/outbox")
    assert page.status_code == 200
    assert "postgresql://postgres:***@127.0.0.1" in page.text
    store = store_from_url(url)  # The worker's store reads the URL as libpq does, too.
    try:
        assert store.get("nothing") is None
    finally:
        store.close()
    assert MARK not in out + err + page.text + caplog.text


def test_a_malformed_percent_in_the_password_is_never_quoted(
    postgres_cluster: postgres_support.Cluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = url_with(postgres_cluster, MALFORMED)
    monkeypatch.setenv("TASKLEASE_OUTBOX_URL", url)
    with caplog.at_level(logging.INFO):
        assert main(["outbox", "migrate"]) == 2
        assert main(["outbox", "relay"]) == 2
        page = create_dashboard_app(MemoryStore(), outbox=url).test_client().get("/outbox")
        with RelayThread(url, producer("http://127.0.0.1:9"), poll=0.05):
            pass  # Entered once the thread has tried, and logged its failure.
        with pytest.raises(ConfigurationError) as started:
            store_from_url(url)
    out, err = capsys.readouterr()
    assert page.status_code == 503
    assert "invalid percent-encoded token" in err  # libpq's reason, its token hidden.
    assert "cannot open postgresql://postgres:***@127.0.0.1" in caplog.text
    assert "invalid percent-encoded token" in str(started.value)
    assert MARK not in out + err + page.text + caplog.text + str(started.value)
