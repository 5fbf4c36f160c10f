"""Files only their owner may read: run records hold payloads, results and error text.

SQLite creates its database with mode 0644 less the umask, and the ``-wal`` / ``-shm`` files
with the database file's own mode. Creating the database file 0600 first, and any missing
folder 0700, keeps all of them private whatever the umask.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
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


def create_private_file(path: Path, initialise: Callable[[Path], None] | None = None) -> None:
    """Create ``path`` 0600 if it does not exist; an existing file is left alone.

    ``initialise`` fills a private temporary file first, which is then linked into place in one
    step: other processes see no file or a complete one, never a half-made one (an empty file
    that several SQLite processes switch to WAL at once can fail with "disk I/O error"). Where
    hard links are not supported, the file is created empty with ``O_EXCL`` instead.
    """
    if path.exists():
        return
    if initialise is not None:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(descriptor)  # mkstemp creates it 0600 whatever the umask.
        try:
            initialise(Path(temporary))
            os.link(temporary, path)
        except FileExistsError:
            return  # Another process linked its own first: that one stands.
        except OSError:
            pass  # No hard links here: fall back to an empty file.
        else:
            return
        finally:
            os.unlink(temporary)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(descriptor, FILE_MODE)  # The umask may have removed bits we want.
    finally:
        os.close(descriptor)
