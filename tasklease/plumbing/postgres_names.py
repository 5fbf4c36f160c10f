"""The Postgres schema a URL's ``?schema=NAME`` names, checked before it reaches SQL.

Both the store and the outbox put the name into statements (``SET search_path``, ``CREATE
SCHEMA``), where no placeholder can stand: only a name that needs no quoting is taken, so a
``"`` or ``;`` in a URL can never end the identifier and run SQL of its own.
"""

from __future__ import annotations

import re

from tasklease.errors import ConfigurationError

# Unquoted identifiers that Postgres keeps as written: lower case, at most 63 bytes
# (NAMEDATALEN - 1, https://www.postgresql.org/docs/current/sql-syntax-lexical.html).
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def checked_schema(name: str) -> str:
    """``name`` when it is a plain Postgres schema name; else a ConfigurationError naming it."""
    if not _SCHEMA_NAME.fullmatch(name):
        raise ConfigurationError(
            f"Postgres schema {name!r}: use [a-z_][a-z0-9_]* (lower case letters, digits and "
            "_, at most 63), e.g. ?schema=tasklease"
        )
    return name
