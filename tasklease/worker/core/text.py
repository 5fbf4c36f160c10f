"""Text every store can keep. Pure: no I/O.

PostgreSQL ``text`` refuses NUL (postgresql.org/docs/current/datatype-character.html: "the
character with code zero cannot be stored"), and no UTF-8 store (SQLite's binding, Postgres,
Firestore, Spanner) can encode a lone surrogate, which JSON's ``"\\ud800"`` and
``os.fsdecode`` both produce. A finish or a lock whose text cannot be written is taken for
the store being down, and the run is then neither recorded nor run.
"""

from __future__ import annotations

__all__ = ["storable_text"]


def storable_text(text: str) -> str:
    """``text`` with each lone surrogate and each NUL written as a backslash escape; text
    without them is returned as it is (valid JSON text never holds either raw)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
