"""Finding: the relay sent every outbox row as written. Anyone able to insert one row (a
database account, an SQL injection elsewhere in the app) had the relay ask Cloud Tasks for an
OIDC token of the invoker account, for an audience of their choice, delivered to a URL of their
choice; replaying that token ran a handler with a forged payload. The relay now sends only to
URLs under ``TASKLEASE_WORKER_URL`` (and the prefixes of ``TASKLEASE_OUTBOX_ALLOWED_URLS``),
with the configured audience and account, and marks anything else failed with the reason;
without a worker URL it does not start."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tasklease.cli import main
from tasklease.emulator import CloudTasksEmulator
from tasklease.outbox import Relay, RelayThread, open_outbox, register, relay_producer
from tasklease.outbox.destinations import Destinations
from tasklease.producer import Producer, task_id
from tasklease.producer.transport import TaskRequest
from tasklease.worker import Router
from tasklease.worker.core.identity import Kind
from tests.support.outbox import (
    LOCATION,
    PROJECT,
    QUEUE,
    QUEUE_PATH,
    WORKER,
    relay_env,
    sqlite_app_db,
    task_names,
)

ACCOUNT = "invoker@p.iam.gserviceaccount.com"
EVIL = "https://evil.example.com"
OWNER = "owner@p.iam.gserviceaccount.com"  # An account the relay's credentials may act as.


def _stage(path: Path, endpoint: str, key: str, worker_url: str = WORKER, **options: Any) -> None:
    """An entry as a producer with these settings writes it: the attacker's insert is a row
    of the same columns, with values of their choice."""
    account = options.pop("service_account", ACCOUNT)
    make = Producer(
        PROJECT, LOCATION, QUEUE, worker_url, service_account=account, tasks_endpoint=endpoint
    )
    conn = sqlite3.connect(path)
    conn.execute("BEGIN")
    make.enqueue("record", {"forged": True}, key=key, transaction=conn, **options)
    conn.commit()
    conn.close()


def test_entries_for_another_url_audience_or_account_are_failed_and_never_sent(
    tmp_path: Path, tasks: CloudTasksEmulator
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    _stage(tmp_path / "app.db", tasks.url, "good")
    _stage(tmp_path / "app.db", tasks.url, "own-handler-audience", audience=f"{WORKER}/tasks/x")
    _stage(tmp_path / "app.db", tasks.url, "elsewhere", worker_url=EVIL)
    _stage(tmp_path / "app.db", tasks.url, "look-alike-host", worker_url=f"{WORKER}.evil.com")
    _stage(tmp_path / "app.db", tasks.url, "user-part", worker_url=f"{WORKER}@evil.com")
    _stage(tmp_path / "app.db", tasks.url, "audience", audience=EVIL)
    _stage(tmp_path / "app.db", tasks.url, "account", service_account=OWNER)
    env = {**relay_env(tasks.url), "TASKLEASE_SERVICE_ACCOUNT": ACCOUNT}
    db = open_outbox(url)
    try:
        done = Relay(db, relay_producer(env)).drain()
        status = db.status(10**10)
    finally:
        db.close()
    assert task_names(tasks) == sorted(
        task_id("record", key) for key in ("good", "own-handler-audience")
    )
    assert (done.sent, done.failed, status.depth) == (2, 5, 0)
    reasons = {failed.id.rsplit("/", 1)[1]: failed.reason for failed in status.failed}
    assert set(reasons) == {
        task_id("record", key)
        for key in ("elsewhere", "look-alike-host", "user-part", "audience", "account")
    }
    assert (
        "refused to send to URL 'https://evil.example.com/tasks/record'"
        in (reasons[task_id("record", "elsewhere")])
    )
    assert "user part" in reasons[task_id("record", "user-part")]
    assert "audience 'https://evil.example.com'" in reasons[task_id("record", "audience")]
    assert OWNER in reasons[task_id("record", "account")]


def _request(url: str, audience: str | None = None) -> TaskRequest:
    return TaskRequest(QUEUE_PATH, "t", url, b"{}", service_account=ACCOUNT, audience=audience)


ALLOWED = Destinations.configured(
    "https://w.run.app", allowed_urls="https://hooks.example.com/worker/, "
)


@pytest.mark.parametrize(
    "url",
    [
        "https://w.run.app/tasks/x",
        "https://w.run.app",
        "https://W.RUN.APP:443/tasks/x",
        "https://w.run.app/tasks/x?project=p",
        "https://hooks.example.com/worker/tasks/x",
        "https://hooks.example.com/worker",
    ],
)
def test_a_url_under_a_prefix_is_sent(url: str) -> None:
    assert ALLOWED.refusal(_request(url)) is None


@pytest.mark.parametrize(
    "url",
    [
        "https://w.run.app.evil.com/tasks/x",
        "https://w.run.app@evil.com/tasks/x",
        "https://w.run.app:443@evil.com/tasks/x",
        "https://evil.com/?https://w.run.app",
        "https://evil.com/https://w.run.app/tasks/x",
        "http://w.run.app/tasks/x",
        "https://w.run.app:8443/tasks/x",
        "https://w.run.app\\@evil.com/tasks/x",
        "https://w.run.app/tasks/x#fragment",
        " https://w.run.app/tasks/x",
        "https://w.run.app/tasks/\n",
        "https://hooks.example.com/workers/tasks/x",
        "https://hooks.example.com/tasks/x",
        "https://hooks.example.com/worker/../admin",
        "https://hooks.example.com/worker/%2e%2e/admin",
        "https://hooks.example.com/worker%2f..%2fadmin",
        "ftp://w.run.app/tasks/x",
        "",
    ],
)
def test_any_other_url_is_refused(url: str) -> None:
    reason = ALLOWED.refusal(_request(url))
    assert reason is not None and reason.startswith("refused to send to URL")


def test_a_token_is_sent_only_for_the_configured_audience_or_one_under_a_prefix() -> None:
    configured = Destinations.configured("https://w.run.app", audience="custom-audience")
    for audience in (None, "", "custom-audience", "https://w.run.app", "https://w.run.app/"):
        assert configured.refusal(_request("https://w.run.app/tasks/x", audience)) is None
    for audience in ("https://evil.com", "https://w.run.app.evil.com", "custom-audience-2"):
        assert "audience" in str(configured.refusal(_request("https://w.run.app/t", audience)))


@pytest.mark.parametrize(
    "prefix",
    ["w.run.app", "https://user@w.run.app", "https://w.run.app/?x=1", "https://w.run.app:x"],
)
def test_a_prefix_that_is_not_a_plain_url_is_refused_naming_the_variable(prefix: str) -> None:
    with pytest.raises(ValueError, match=r"TASKLEASE_OUTBOX_ALLOWED_URLS: .* cannot be an outbox"):
        Destinations.configured("https://w.run.app", allowed_urls=prefix)


def test_the_cli_relay_does_not_start_without_a_worker_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    monkeypatch.delenv("TASKLEASE_WORKER_URL", raising=False)
    assert main(["outbox", "relay", "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("tasklease outbox relay: set TASKLEASE_WORKER_URL to the worker's URL")


def test_the_cli_relay_does_not_start_with_a_prefix_that_is_not_a_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    monkeypatch.setenv("TASKLEASE_WORKER_URL", WORKER)
    monkeypatch.setenv("TASKLEASE_OUTBOX_ALLOWED_URLS", "hooks.example.com")
    assert main(["outbox", "relay", "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TASKLEASE_OUTBOX_ALLOWED_URLS: 'hooks.example.com'" in err


def test_an_in_process_relay_without_a_worker_url_says_so_once_and_sends_nothing(
    tmp_path: Path,
    tasks: CloudTasksEmulator,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = sqlite_app_db(tmp_path / "app.db")
    _stage(tmp_path / "app.db", tasks.url, "waits")
    monkeypatch.delenv("TASKLEASE_WORKER_URL", raising=False)
    monkeypatch.setenv("TASKLEASE_TASKS_ENDPOINT", tasks.url)
    caplog.set_level(logging.ERROR, "tasklease.outbox")
    with RelayThread(url, poll=0.05):
        pass
    router = Router()
    register(router, url=url)
    sweep = router.handler(Kind.SCHEDULER, "tasklease_outbox_sweep")
    assert sweep is not None
    for _ in range(2):
        assert sweep.function(None) == {"sent": 0, "failed": 0, "retrying": 0, "purged": 0}
    said = [r.getMessage() for r in caplog.records if "TASKLEASE_WORKER_URL" in r.getMessage()]
    assert len(said) == 2  # The thread's, and the sweeper's once for its two runs.
    assert all("relaying nothing" in line for line in said)
    assert task_names(tasks) == []
    db = open_outbox(url)
    try:
        assert db.status(10**10).depth == 1
    finally:
        db.close()
