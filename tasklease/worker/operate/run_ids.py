"""A run named by a prefix of its id, as log lines print it (12 characters): any prefix of
at least :data:`MIN_PREFIX` characters that one run's id starts with names that run.

Stores look runs up by their whole id only, so a prefix is matched by reading the listing
(newest first), at most ``max_scan`` records: ample for a dev store, and a clear error,
never a wrong run, when a store is larger.
"""

from __future__ import annotations

from tasklease.errors import TaskleaseError
from tasklease.worker.core.queries import RunFilter
from tasklease.worker.stores.base.queries import OperatorQueries

MIN_PREFIX = 8
MAX_SCAN = 20_000
_SHOWN = 10  # Matches an ambiguous prefix lists at most.


class AmbiguousRunId(TaskleaseError):
    """A prefix more than one run's id starts with (the message lists them), or a prefix
    that could not be checked against every run."""

    def __init__(self, message: str, matches: list[str]) -> None:
        super().__init__(message)
        self.matches = matches


def resolve_run_id(store: OperatorQueries, reference: str, max_scan: int = MAX_SCAN) -> str:
    """The id of the one run ``reference`` names: itself when a run has that id, else the
    one id it is a prefix of; ``reference`` unchanged when none (callers say "no run");
    AmbiguousRunId when several start with it."""
    if len(reference) < MIN_PREFIX or "/" in reference or store.get(reference) is not None:
        return reference
    matches: list[str] = []
    cursor: str | None = None
    scanned = 0
    while True:
        page = store.query_runs(RunFilter(), 500, cursor)
        scanned += len(page.runs)
        matches += [r.run_id for r in page.runs if r.run_id.startswith(reference)]
        cursor = page.cursor
        if cursor is None or len(matches) > 1:
            break
        if scanned >= max_scan:
            raise AmbiguousRunId(
                f"run id prefix {reference!r}: the store holds over {max_scan} runs, too many "
                "to match a prefix against; give the whole run id",
                matches,
            )
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return reference
    shown = ", ".join(matches[:_SHOWN])
    raise AmbiguousRunId(
        f"run id prefix {reference!r} matches several runs ({shown}): give more characters",
        matches,
    )
