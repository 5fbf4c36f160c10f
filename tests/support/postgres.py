"""A private PostgreSQL cluster for the tests: ``initdb`` into a temporary folder, a free
loopback port, ``pg_ctl start``; stopped (``-m immediate``) at the end.

The binaries come from ``TASKLEASE_PG_BINDIR``, the newest ``/usr/lib/postgresql/*/bin``
(Debian's layout), or ``PATH``. Without them the tests skip, and fail in CI (``CI=true``).
As root, the cluster runs as the ``postgres`` user: the server refuses to run as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from tasklease.plumbing.serve import free_port

IN_CI = os.environ.get("CI") == "true"


class NoPostgres(RuntimeError):
    pass


def bindir() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``."""
    configured = os.environ.get("TASKLEASE_PG_BINDIR")
    candidates = [Path(configured)] if configured else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    raise NoPostgres("no PostgreSQL binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin")


class Cluster:
    """One private cluster: its folder, port and the processes it runs."""

    def __init__(self, *, durable: bool = False) -> None:
        self.bin = bindir()
        self.root = Path(tempfile.mkdtemp(prefix="tasklease-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.durable = durable
        self._user = _run_as()
        self.sockets.mkdir()
        if self._user is not None:
            for path in (self.root, self.sockets):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip

    def url(self, database: str = "postgres", **options: str) -> str:
        query = "&".join(f"{key}={value}" for key, value in options.items())
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}" + (
            f"?{query}" if query else ""
        )

    def start(self) -> None:
        settings = [
            f"-p {self.port}",
            f"-k {self.sockets}",
            "-c listen_addresses=127.0.0.1",
            "-c max_connections=200",
        ]
        if not self.durable:
            # Tests: no fsync, which only a crash of the machine would need. Each commit still
            # writes its WAL (synchronous_commit stays on), so a killed server keeps it.
            settings += ["-c fsync=off", "-c full_page_writes=off"]
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
            "-o", " ".join(settings), "start",
        )  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        with suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        """Crash the server (``-m immediate``: no checkpoint) and start it again."""
        self.stop("immediate")
        self.start()

    def processes(self) -> list[int]:
        """The postmaster and every backend and helper process it forked."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(
            ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [postmaster, *map(int, children)]

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """SIGSTOP the whole server (postmaster and backends) for the block, then SIGCONT."""
        stopped = self.processes()
        for pid in stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in stopped:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def sql(self, statement: str, database: str = "postgres") -> Any:
        import psycopg  # noqa: PLC0415 - the extra is only needed where Postgres is tested.

        with psycopg.connect(self.url(database), autocommit=True) as connection:
            cursor = connection.execute(statement)
            return cursor.fetchall() if cursor.description else None

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        user = self._user
        subprocess.run(
            command,
            check=True,
            capture_output=True,
            cwd=self.root,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
            timeout=120,
        )


def _run_as() -> pwd.struct_passwd | None:
    """The user the server runs as: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError as exc:
        raise NoPostgres("running as root and there is no postgres user to run the server") from exc


def start_cluster(*, durable: bool = False) -> Cluster:
    """A started cluster; fails in CI, skips elsewhere, when PostgreSQL is not installed."""
    try:
        cluster = Cluster(durable=durable)
    except NoPostgres as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required in CI: {exc}", pytrace=False)
        pytest.skip(f"{exc}: install postgresql-15")
    try:
        cluster.start()
    except BaseException:
        cluster.remove()
        raise
    return cluster


@contextmanager
def running_cluster(*, durable: bool = False) -> Iterator[Cluster]:
    cluster = start_cluster(durable=durable)
    try:
        yield cluster
    finally:
        cluster.remove()


def fresh_schema() -> str:
    """A schema name no other test uses: each test's store starts empty (and migrates)."""
    return f"t_{uuid.uuid4().hex[:12]}"


def wait_until_answers(cluster: Cluster, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            cluster.sql("SELECT 1")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
