"""Finding: the redactor reads a Postgres URL exactly as libpq does, and libpq ends the user
part at the first ``@`` only when no ``/`` comes before it. A password with an unencoded
``/`` (common in generated and base64 passwords), ``postgresql://app:Zq9/s3cret@db/app``, is
then no password to either: libpq reads host ``app``, port ``Zq9`` and fails, and
``shown_url`` returns the URL as written. ``tasklease runs`` prints it on stderr, and
``tasklease outbox relay --url`` accepts it, leaving the password in the process's command
line. A URL that does not log in still carries the real password: whatever looks like one
(text up to the last ``@`` before the query) must be hidden too."""

from __future__ import annotations

import pytest

from tasklease.cli import main
from tasklease.plumbing.url_secrets import has_password, shown_url

SECRET = "Zq9/s3cret-pw"
URL = f"postgresql://postgres:{SECRET}@127.0.0.1:1/db"


def test_the_redactor_hides_a_password_holding_a_slash() -> None:
    assert SECRET not in shown_url(URL)
    assert has_password(URL)


def test_tasklease_runs_does_not_print_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TASKLEASE_STORE", URL)
    main(["runs", "list"])  # Fails to connect: the URL does not log in.
    out, err = capsys.readouterr()
    assert "store: postgresql://" in err
    assert "s3cret" not in out + err


def test_outbox_relay_refuses_it_on_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TASKLEASE_WORKER_URL", "https://w.run.app")
    assert main(["outbox", "relay", "--url", URL]) == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and "TASKLEASE_OUTBOX_URL" in err
