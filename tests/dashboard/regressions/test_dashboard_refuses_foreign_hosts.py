"""The standalone dashboard (``tasklease dashboard``, ``tasklease dev``) answers only Host names
that are loopback, its bind host or configured: a page that rebinds its own name to
127.0.0.1 (DNS rebinding) must neither read runs nor release one. Over real HTTP, and in
headless Chromium with the rebinding done by its host resolver."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tasklease.cli.dashboard import serving_dashboard
from tasklease.plumbing.serve import free_port
from tasklease.testing.operations_contract import seed_every_state
from tasklease.worker.core.records import RunStatus
from tasklease.worker.dashboard import create_dashboard_app
from tasklease.worker.stores import SqliteStore
from tests.support.browser import chromium

REBOUND = "rebound.test"  # The attacker's name, answering 127.0.0.1 once the page has loaded.


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, int, SqliteStore]]:
    path = tmp_path / "runs.db"
    store = SqliteStore(path)
    seed_every_state(store, datetime.now(UTC) - timedelta(hours=1))
    port = free_port()
    with serving_dashboard(f"sqlite:///{path}", "127.0.0.1", port, None) as url:
        yield url, port, store
    store.close()


def test_a_foreign_host_header_reads_no_run_and_releases_none(
    served: tuple[str, int, SqliteStore],
) -> None:
    url, port, store = served
    foreign = {"Host": f"{REBOUND}:{port}"}
    listing = requests.get(url, headers=foreign, timeout=10)
    assert listing.status_code == 403
    assert "t-failed" not in listing.text and "live" not in listing.text
    confirm = requests.get(url + "runs/live/release", headers=foreign, timeout=10)
    assert confirm.status_code == 403 and "csrf_token" not in confirm.text
    posted = requests.post(
        url + "runs/live/release",
        data={"force": "1"},
        headers={**foreign, "Origin": f"http://{REBOUND}:{port}"},
        timeout=10,
    )
    assert posted.status_code == 403
    assert store.get("live").status is RunStatus.IN_PROGRESS  # type: ignore[union-attr]
    for name in ("127.0.0.1", "localhost", "[::1]", "LOCALHOST"):
        answer = requests.get(url, headers={"Host": f"{name}:{port}"}, timeout=10)
        assert answer.status_code == 200, name
        assert "t-failed" in answer.text


def test_a_non_loopback_bind_answers_its_own_host_and_the_allowed_names_only(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    app = create_dashboard_app(store, host="10.1.2.3", allowed_hosts=["ops.internal"])
    client = app.test_client()
    for host in ("10.1.2.3:8090", "ops.internal", "OPS.internal:8090", "127.0.0.1:8090"):
        assert client.get("/", headers={"Host": host}).status_code == 200, host
    for host in (REBOUND, "10.1.2.4", "ops.internal.evil.example", "bad host", ""):
        assert client.get("/", headers={"Host": host}).status_code == 403, host
    wildcard = create_dashboard_app(store, host="0.0.0.0").test_client()
    assert wildcard.get("/", headers={"Host": "0.0.0.0:8090"}).status_code == 403
    store.close()


ATTACK = """
(async () => {
  const page = await fetch('/runs/live/release');
  const text = await page.text();
  if (page.status !== 200) return 'refused ' + page.status;
  const form = new FormData();
  for (const [, name, value] of text.matchAll(/name="([^"]+)" value="([^"]*)"/g))
    form.append(name, value);
  const posted = await fetch('/runs/live/release', {method: 'POST', body: form});
  return 'posted ' + posted.status;
})()
"""


def test_a_rebinding_page_in_chromium_cannot_release_a_live_run(
    served: tuple[str, int, SqliteStore],
) -> None:
    _, port, store = served
    with chromium([f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"]) as browser:
        tab = browser.tab()
        # The attacker's own page, served before its name was rebound, has no CSP of ours:
        # its scripts may fetch (the dashboard's CSP, on the page we load here, would not).
        tab.send("Page.setBypassCSP", {"enabled": True})
        tab.goto(f"http://{REBOUND}:{port}/")
        assert "t-failed" not in tab.text(), "the rebound page read the runs"
        answer: dict[str, Any] = tab.send(
            "Runtime.evaluate", {"expression": ATTACK, "awaitPromise": True, "returnByValue": True}
        )
    outcome = answer["result"]["value"]
    assert re.fullmatch(r"refused 403", outcome), outcome
    assert store.get("live").status is RunStatus.IN_PROGRESS  # type: ignore[union-attr]
