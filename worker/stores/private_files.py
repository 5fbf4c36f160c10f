"""Files only their owner may read: run records hold payloads, results and error text.

SQLite creates its database with mode 0644 less the umask, and the ``-wal`` / ``-shm`` files
with the database file's own mode. Creating the database file 0600 first, and any missing
folder 0700, keeps all of them private whatever the umask.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and any missing parent, each 0700; existing ones stay as they are."""
    missing: list[Path] = []
    while not directory.exists():
        missing.append(directory)
        if directory.parent == directory:
            break
        directory = directory.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIRECTORY_MODE)
        except FileExistsError:
            continue  # Another process made it first: its choice of mode stands.
        folder.chmod(DIRECTORY_MODE)  # mkdir's mode is subject to the umask.


def create_private_file(path: Path) -> None:
    """Create ``path`` empty and 0600 if it does not exist; an existing file is left alone.

    SQLite takes an empty file for a new database. ``O_EXCL`` makes exactly one process the
    creator when several open a fresh store together.
    """
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(descriptor, FILE_MODE)  # The umask may have removed bits we want.
    finally:
        os.close(descriptor)
