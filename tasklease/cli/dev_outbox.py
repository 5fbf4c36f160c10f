"""The outbox relay inside ``tasklease dev``: for ``TASKLEASE_OUTBOX_URL``, else the store's
own database when it has a ``tasklease_outbox`` table."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping

from tasklease.outbox.locate import outbox_url
from tasklease.plumbing.url_secrets import shown_url

_log = logging.getLogger("tasklease.dev")

__all__ = ["dev_relay", "outbox_url"]


@contextlib.contextmanager
def dev_relay(store_url: str, env: Mapping[str, str]) -> Iterator[str | None]:
    """A following relay (the fast path, then polls) through the emulator while dev runs."""
    url = outbox_url(store_url)
    if url is None:
        yield None
        return
    from tasklease.outbox.sweeper import RelayThread, relay_producer  # noqa: PLC0415

    with RelayThread(url, relay_producer(env), poll=0.5):
        _log.info("outbox relay for %s", shown_url(url))
        yield url
