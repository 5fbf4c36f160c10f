"""Why the pool gave no connection: psycopg_pool's timeout says only that it waited
("couldn't get a connection after 5.00 sec"); the reason (a wrong password, a database that
does not exist, a refused port) is in its log. One direct connection attempt, made only
after the pool has given up, finds the reason for the error an operator reads."""

from __future__ import annotations

import psycopg

from tasklease.plumbing.url_secrets import scrubbed

__all__ = ["why_no_connection"]


def why_no_connection(conninfo: str, waited: BaseException, timeout: float) -> str:
    """The reason a connection to ``conninfo`` cannot be made now, or the pool's own
    message (``waited``) when a direct attempt succeeds (the pool was only busy)."""
    try:
        probe = psycopg.Connection.connect(
            conninfo, connect_timeout=max(1, round(timeout)), autocommit=True
        )
    except psycopg.Error as exc:
        reason = scrubbed(str(exc).strip().replace("\n", " "), conninfo)
        return f"no connection: {reason}"
    probe.close()
    return f"no connection: {waited} (every connection of the pool in use)"
