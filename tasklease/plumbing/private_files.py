"""Files only their owner may read: run records hold payloads, results and error text.

SQLite creates its database with mode 0644 less the umask, and the ``-wal`` / ``-shm`` files
with the database file's own mode. Creating the database file 0600 first, and any missing
folder 0700, keeps all of them private whatever the umask.

A folder others may write to can hold files planted before us: a symbolic link where the
database should be (SQLite follows it), a ``-wal`` anyone may read, a ``.lock`` someone else
holds. A file that already exists is used only when it is a regular file, not a link, owned
by this user and closed to everyone else; anything else is refused with a
:class:`ConfigurationError` naming the file and what is wrong with it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from tasklease.errors import ConfigurationError

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
# SQLite's companions of a database file: created next to it, with its mode, by name.
COMPANIONS = ("-wal", "-shm")
_CHECKED_ONLY = ("-journal",)  # Rollback journals: never made here, refused if planted.
_NEW = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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


def check_private(path: Path) -> None:
    """Refuse ``path`` unless it is absent or a private regular file of this user."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    _refuse_unless_private(path, info)


def check_own(path: Path) -> None:
    """Refuse ``path`` unless it is absent or a regular file of this user, whatever its mode:
    for a file another program made and chose the mode of (an application's database)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    _refuse_unless_private(path, info, mode_checked=False)


def open_private(path: Path, flags: int = os.O_RDWR) -> int:
    """Open ``path``, creating it 0600 if absent, never through a symbolic link; an existing
    file must be private (:func:`check_private`). Return the descriptor."""
    try:
        descriptor = os.open(path, flags | _NEW, FILE_MODE)
    except FileExistsError:
        pass
    else:
        return _owner_only(descriptor)
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        check_private(path)  # A link (ELOOP) or someone else's file (EACCES): say which.
        raise
    try:
        _refuse_unless_private(path, os.fstat(descriptor))
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def create_private_file(path: Path, initialise: Callable[[Path], None] | None = None) -> None:
    """Create ``path`` 0600 if it does not exist; an existing file must be private.

    ``initialise`` fills a private temporary file first, which is then linked into place in one
    step: other processes see no file or a complete one, never a half-made one (an empty file
    that several SQLite processes switch to WAL at once can fail with "disk I/O error"). Where
    hard links are not supported, the file is created empty with ``O_EXCL`` instead.
    """
    if os.path.lexists(path):
        check_private(path)
        return
    if initialise is not None:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(descriptor)  # mkstemp creates it 0600 whatever the umask.
        try:
            initialise(Path(temporary))
            os.link(temporary, path)  # link() never follows a link at its target name.
        except FileExistsError:
            check_private(path)  # Another process linked its own first, or a link was planted.
            return
        except OSError:
            pass  # No hard links here: fall back to an empty file.
        else:
            return
        finally:
            os.unlink(temporary)
    try:
        descriptor = os.open(path, os.O_WRONLY | _NEW, FILE_MODE)
    except FileExistsError:
        check_private(path)
        return
    os.close(_owner_only(descriptor))


def write_private_text(path: Path, text: str) -> None:
    """Replace ``path`` with a 0600 file holding ``text``.

    The text goes to a private temporary file in the same folder, renamed over ``path`` in
    one step: readers see the old file or the new one, whatever was there before (a file
    of another mode, a planted symbolic link) is replaced, never written through.
    """
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:  # mkstemp made it 0600.
            file.write(text)
        os.replace(temporary, path)  # rename(2) replaces a link itself, not its target.
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def prepare_private_database(path: Path, initialise: Callable[[Path], None] | None = None) -> None:
    """Make a SQLite database's folder, file and ``-wal`` / ``-shm`` private before opening it.

    Missing companions are created empty 0600 (SQLite takes an empty ``-wal`` for no log and
    sizes ``-shm`` itself), so SQLite opens files of ours rather than creating them by name
    where someone else could have first. Call :func:`check_private_database` after opening:
    SQLite deletes its companions when the last connection closes, and makes them again.
    """
    make_private_dirs(path.parent)
    create_private_file(path, initialise)
    for suffix in COMPANIONS:
        # Never open an existing companion: closing any descriptor of a file drops every
        # POSIX lock this process holds on it (fcntl(2)), SQLite's on -shm included; another
        # process then takes itself for the first, resets -shm, and this one's mapping of it
        # dies with SIGBUS (sqlite.org/howtocorrupt.html, "posix advisory locks canceled").
        create_private_file(Path(f"{path}{suffix}"))
    for suffix in _CHECKED_ONLY:
        check_private(Path(f"{path}{suffix}"))


def check_private_database(path: Path) -> None:
    """Refuse a database whose file or companions are not (or no longer) private."""
    for suffix in ("", *COMPANIONS, *_CHECKED_ONLY):
        check_private(Path(f"{path}{suffix}"))


def _owner_only(descriptor: int) -> int:
    try:
        os.fchmod(descriptor, FILE_MODE)  # The umask may have removed bits we want.
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _refuse_unless_private(path: Path, info: os.stat_result, *, mode_checked: bool = True) -> None:
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise ConfigurationError(
            f"{path} is a symbolic link (to {target}): refusing to follow it, "
            "someone may have planted it; name the real file, in a folder only you can write"
        )
    if not stat.S_ISREG(info.st_mode):
        raise ConfigurationError(f"{path} is not a regular file: refusing to use it")
    user = os.geteuid()
    if info.st_uid != user:
        raise ConfigurationError(
            f"{path} belongs to uid {info.st_uid}, not to this user (uid {user}): someone "
            "else made it and may read or hold it; remove it, or use a folder only you can write"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode_checked and mode & 0o077:
        raise ConfigurationError(
            f"{path} has mode {mode:04o}: other users may read or change it; it must be "
            f"0600 (chmod 600 {path}, after checking who else had it)"
        )
