"""Which store a command reads: ``--store``, else ``$TASKLEASE_STORE``, else the store the
``tasklease dev`` started in this directory wrote down, else the default file.

Commands that read or repair runs (``runs``, ``locks``, ``dashboard``) open a store that
exists, never a new empty one: a SQLite URL naming a missing file is an error naming it.
They show the store's URL without its password; the file ``tasklease dev`` writes holds
it whole, so it is made 0600.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tasklease import protocol
from tasklease.errors import ConfigurationError, StoreUnavailable
from tasklease.plumbing.private_files import make_private_dirs, write_private_text
from tasklease.plumbing.url_secrets import scrubbed, shown_url
from tasklease.worker.core import constants as c
from tasklease.worker.stores import LeaseStore

# Where ``tasklease dev`` writes the URL of the store its worker uses, relative to its cwd.
DEV_STORE_FILE = Path(".tasklease") / "store-url"
STORE_HELP = "store URL (default: $TASKLEASE_STORE, else the store tasklease dev uses here)"


@dataclass(frozen=True)
class StoreChoice:
    url: str
    source: str  # "--store", "$TASKLEASE_STORE", "tasklease dev (...)" or "the default".


def choose_store(flag: str | None) -> StoreChoice:
    """The store URL a read command uses, and where it came from."""
    if flag:
        return StoreChoice(flag, "--store")
    from_env = os.environ.get(protocol.ENV_STORE)
    if from_env:
        return StoreChoice(from_env, f"${protocol.ENV_STORE}")
    try:
        written = DEV_STORE_FILE.read_text(encoding="utf-8").strip()
    except OSError:
        written = ""
    if written:
        return StoreChoice(written, f"the one `tasklease dev` uses ({DEV_STORE_FILE})")
    return StoreChoice(c.DEFAULT_STORE_URL, "the default")


def sqlite_path(url: str) -> Path | None:
    """The file a ``sqlite://`` URL names (as :func:`store_from_url` reads it), else None."""
    scheme, _, rest = url.partition("://")
    if scheme != "sqlite":
        return None
    path = rest[1:] if rest.startswith("/") else rest
    return Path(path) if path else None


def open_existing_store(
    flag: str | None, make_store: Callable[[str | None], LeaseStore], err: TextIO
) -> LeaseStore:
    """The chosen store, opened (see :func:`existing_store_url`); its errors never quote
    the URL's password."""
    url = existing_store_url(flag, err)
    try:
        return make_store(url)
    except ConfigurationError as exc:
        raise ConfigurationError(scrubbed(str(exc), url)) from None
    except StoreUnavailable as exc:
        raise StoreUnavailable(scrubbed(str(exc), url)) from None


def existing_store_url(flag: str | None, err: TextIO) -> str:
    """The chosen store's URL; ConfigurationError for a SQLite file that does not exist
    (nothing is created). Says on ``err`` which store it is unless ``--store`` named it."""
    choice = choose_store(flag)
    path = sqlite_path(choice.url)
    if path is not None and not path.exists():
        raise ConfigurationError(
            f"no store at {path} ({choice.source}): nothing created; start `tasklease dev` "
            f"in this directory, or give --store or ${protocol.ENV_STORE}"
        )
    if choice.source != "--store":
        print(f"store: {shown_url(choice.url)} ({choice.source})", file=err)
    return choice.url


def write_dev_store(url: str) -> str:
    """Record ``url`` for the read commands run later in this directory; the URL written
    (a relative SQLite path made absolute, so it names the same file from anywhere). The
    file is 0600: the URL may hold the database's password."""
    path = sqlite_path(url)
    if path is not None and not path.is_absolute():
        url = f"sqlite:///{path.resolve()}"
    make_private_dirs(DEV_STORE_FILE.parent)
    write_private_text(DEV_STORE_FILE, url + "\n")
    return url
