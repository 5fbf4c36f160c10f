"""The sweeper: a scheduled job relaying what the fast path missed, and a relay thread.

``register(router, url=...)`` hands the router a :class:`Sweep`, which the router registers
as the job ``tasklease_outbox_sweep`` (``POST /jobs/tasklease_outbox_sweep``); schedule it
every minute (the deploy kit's ``[[job]]``). It relays every due entry (a crash between commit
and relay, a Cloud Tasks outage) and deletes sent entries older than ``keep_sent``.
``RelayThread`` runs a following relay in a process (``tasklease dev`` starts one). The outbox
imports nothing of the worker: the router is known here only by the one method it calls.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from tasklease.outbox.db import OutboxDB, open_outbox
from tasklease.outbox.destinations import ENV_WORKER_URL, NoWorkerURL, for_producer
from tasklease.outbox.locate import ENV_OUTBOX_URL
from tasklease.outbox.relay import LEASE, Relay, Round, quick_retry
from tasklease.plumbing.url_secrets import scrubbed, shown_url

if TYPE_CHECKING:
    from tasklease.producer.producer import Producer

SWEEP_JOB = "tasklease_outbox_sweep"
_log = logging.getLogger("tasklease.outbox")


def relay_producer(environ: Any = None) -> Producer:
    """The relay's producer: the ``TASKLEASE_*`` settings, retrying little (entries back off).

    The entries carry their URL, queue and account; besides the transport settings, the
    worker URL, audience and account say which of them the relay may send
    (:mod:`tasklease.outbox.destinations`): :class:`NoWorkerURL` without
    ``TASKLEASE_WORKER_URL``."""
    from tasklease.producer.producer import Producer  # noqa: PLC0415

    env = dict(os.environ if environ is None else environ)
    if not env.get(ENV_WORKER_URL):
        raise NoWorkerURL
    for name in ("TASKLEASE_PROJECT", "TASKLEASE_LOCATION"):
        env.setdefault(name, "outbox")
    return Producer.from_env(env, retry=quick_retry())


class SweepJobs(Protocol):
    """What :func:`register` needs of a router: :meth:`tasklease.worker.Router.add_outbox_sweep`."""

    def add_outbox_sweep(self, name: str, sweep: Sweep) -> None: ...


class Sweep:
    """One run of the sweeper job: relay every due entry of the outbox at ``url`` (default
    ``TASKLEASE_OUTBOX_URL``) and purge sent entries older than ``keep_sent``. Without a
    worker URL (no ``producer``, no ``TASKLEASE_WORKER_URL``) it says so in the log once and
    only purges."""

    def __init__(
        self,
        *,
        url: str | None = None,
        producer: Producer | None = None,
        keep_sent: timedelta = timedelta(days=7),
    ) -> None:
        self.url, self.producer, self.keep_sent = url, producer, keep_sent
        self._unconfigured: list[str] = []  # The refusal, once logged.

    def __call__(self) -> dict[str, int]:
        target = self.url or os.environ.get(ENV_OUTBOX_URL)
        if not target:
            raise ValueError(f"the outbox sweeper needs url= or {ENV_OUTBOX_URL}")
        try:
            relaying = self.producer or relay_producer()
            destinations = for_producer(relaying)
        except ValueError as exc:  # NoWorkerURL, or a setting that is refused.
            if not self._unconfigured:
                self._unconfigured.append(str(exc))
                _log.error("outbox sweeper: relaying nothing: %s", exc)
            relaying = None
        db = open_outbox(target)
        try:
            if relaying is None:
                done = Round()
                purged = db.purge_sent(time.time() - self.keep_sent.total_seconds())
            else:
                relay = Relay(
                    db,
                    relaying,
                    destinations=destinations,
                    keep_sent=self.keep_sent.total_seconds(),
                )
                done = relay.drain()
                purged = done.purged
        finally:
            db.close()
        return {
            "sent": done.sent,
            "failed": done.failed,
            "retrying": done.retrying,
            "purged": purged,
        }


def register(
    router: SweepJobs,
    *,
    url: str | None = None,
    producer: Producer | None = None,
    name: str = SWEEP_JOB,
    keep_sent: timedelta = timedelta(days=7),
) -> None:
    """Have ``router`` serve the sweeper job ``name``: each time Cloud Scheduler runs it, a
    :class:`Sweep` of the outbox at ``url`` (default ``TASKLEASE_OUTBOX_URL``)."""
    router.add_outbox_sweep(name, Sweep(url=url, producer=producer, keep_sent=keep_sent))


class RelayThread:
    """A following relay on a daemon thread: ``with RelayThread(url):``."""

    def __init__(
        self,
        url: str,
        producer: Producer | None = None,
        poll: float = 1.0,
        lease: float = LEASE,
    ) -> None:
        self._url, self._producer, self._poll, self._lease = url, producer, poll, lease
        self._relay: Relay | None = None
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tasklease-outbox", daemon=True)

    def _open(self) -> OutboxDB | None:
        """The outbox, tried every ``poll`` s until it opens (a database still starting, a
        volume not mounted yet): the thread must not end on it. None once stopped."""
        while not self._stopped.is_set():
            try:
                return open_outbox(self._url)
            except Exception as exc:
                _log.warning(
                    "outbox relay: cannot open %s (%s: %s); trying again in %.1f s",
                    shown_url(self._url),
                    type(exc).__name__,
                    scrubbed(str(exc), self._url),
                    self._poll,
                )
                self._ready.set()  # Whoever waits for the start need not wait for this.
                self._stopped.wait(self._poll)
        return None

    def _run(self) -> None:
        try:
            producer = self._producer or relay_producer()
            destinations = for_producer(producer)
        except ValueError as exc:  # NoWorkerURL, or a setting that is refused.
            _log.error("outbox relay: not started, relaying nothing: %s", exc)
            self._ready.set()
            return
        db = self._open()
        if db is None:
            return
        try:
            self._relay = Relay(db, producer, lease=self._lease, destinations=destinations)
            self._ready.set()
            if not self._stopped.is_set():
                self._relay.follow(self._poll)
        finally:
            self._ready.set()
            db.close()

    def __enter__(self) -> RelayThread:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopped.set()
        if self._relay is not None:
            self._relay.stop()
        self._thread.join(timeout=self._poll + 10)
