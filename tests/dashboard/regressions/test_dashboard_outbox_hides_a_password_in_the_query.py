"""Finding: the outbox page (and its warning log line) promises never to show the database's
password, but hid it only in the URL's user part: a libpq URL may carry it as a query
parameter (``?password=...``, ``sslpassword``), and that was shown as given."""

from __future__ import annotations

import pytest

from tasklease.plumbing.url_secrets import shown_url


@pytest.mark.parametrize("name", ["password", "sslpassword"])
def test_a_password_given_as_a_query_parameter_is_hidden(name: str) -> None:
    shown = shown_url(f"postgresql://shop@db.internal/shop?{name}=s3cret&schema=app")
    assert "s3cret" not in shown
    assert shown == f"postgresql://shop@db.internal/shop?{name}=***&schema=app"


def test_a_url_without_a_password_is_shown_as_given() -> None:
    url = "postgresql://shop@db.internal/shop?schema=app&sslmode=require"
    assert shown_url(url) == url
