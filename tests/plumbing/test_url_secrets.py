"""The one redactor of database URLs: what it hides, and that it changes nothing else."""

from __future__ import annotations

import pytest

from tasklease.plumbing.url_secrets import MASK, has_password, scrubbed, shown_url, split_options

HIDDEN = [
    # (url, the secret that must not be shown)
    ("postgresql://app:s3cret-pw@db:5432/shop", "s3cret-pw"),
    ("postgresql://app:s3#cret-pw@db/shop", "s3#cret-pw"),
    ("postgresql://app:s3?cret-pw@db/shop?schema=tl", "s3?cret-pw"),
    ("postgresql://app:s3/cret-pw@db/shop", "s3/cret-pw"),
    ("postgres://app:p%40ss-word@db/shop", "p@ss-word"),
    ("postgresql://app@db/shop?password=s3cret-pw", "s3cret-pw"),
    ("postgresql://app@db/shop?sslpassword=s3cret-pw&sslmode=require", "s3cret-pw"),
    ("host=db user=app password='s3 cret\\'pw'", "s3 cret\\'pw"),
    ("redis://:s3cret-pw@cache:6379/0", "s3cret-pw"),
]


@pytest.mark.parametrize(("url", "secret"), HIDDEN)
def test_a_secret_is_never_shown(url: str, secret: str) -> None:
    shown = shown_url(url)
    assert secret not in shown
    assert MASK in shown
    assert has_password(url)
    assert secret not in scrubbed(f"connection to {url} failed: bad password {secret}", url)


@pytest.mark.parametrize(
    "url",
    ["postgresql://app@db:5432/shop?schema=tl", "sqlite:///var/data/runs.db", "memory://"],
)
def test_a_url_without_a_secret_is_shown_as_given(url: str) -> None:
    assert shown_url(url) == url
    assert not has_password(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cret-pw@db:5432/shop",
        "postgresql://app:s3#cret-pw@db/shop",
        "postgresql://app:s3?cret-pw@db/shop?sslmode=require",
        "postgresql://app:s3/cret-pw@db/shop",
        "postgres://app:p%40ss-word@db/shop",
    ],
)
def test_taking_our_options_out_keeps_the_rest_as_written(url: str) -> None:
    with_options = url + ("&" if "?" in url else "?") + "schema=tl&group_commit=off"
    rest, taken = split_options(with_options, {"schema", "group_commit"})
    assert rest == url
    assert taken == [("schema", "tl"), ("group_commit", "off")]
