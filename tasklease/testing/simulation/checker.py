"""The independent history checker: reads what the effects left (the downstream's writes, the
ledger's rows, the queue's and the scheduler's logs) and never tasklease's run records, and
names each way they break the guarantee.

The invariants, each a function of the :class:`~tasklease.testing.simulation.history.History`:

- ``one_key_per_lifecycle``: every execution of one lifecycle presents the same idempotency
  key, and no two lifecycles share one (else a third party with idempotency keys does the
  effect twice, or drops one).
- ``write_after_acknowledged``: no handler writes for a lifecycle whose 2xx the queue heard
  (a completed run never runs again).
- ``holders_interleave``: two attempts whose leases hold by their own clocks never write to
  one resource (a run, an exclusive job, a concurrency key) by turns.
- ``fenced_while_holding``: a write made while its attempt's lease held is never refused by
  the fence (no other attempt got a newer token meanwhile).
- ``token_reused``: two attempts never present the same fencing token for one resource.
- ``refused_while_holding``: no attempt answers that its claim was taken over (``lost_claim``,
  which makes the queue run the handler again) while its lease still holds by its own clock:
  no other attempt can have taken a run or a lock over before that lease ran out.
- ``ledger_twice`` / ``acknowledged_without_effect``: a transactional lifecycle commits its
  ledger row at most once, and exactly once if acknowledged; a plain one acknowledged has a
  final write.
- ``not_settled``: every lifecycle ends acknowledged, or given up by the queue or the
  scheduler after every retry.
- ``crashed``: nothing escaped the real code as an unexpected exception.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tasklease.testing.simulation.history import History, Write

__all__ = ["INVARIANTS", "HistoryViolation", "check"]

INVARIANTS = (
    "one_key_per_lifecycle",
    "write_after_acknowledged",
    "holders_interleave",
    "fenced_while_holding",
    "token_reused",
    "refused_while_holding",
    "ledger_twice",
    "acknowledged_without_effect",
    "not_settled",
    "crashed",
)


@dataclass(frozen=True)
class HistoryViolation:
    """One broken invariant: which, where (the lifecycle or resource), when, and what."""

    invariant: str
    subject: str
    at: float
    detail: str

    def describe(self, replay: str) -> str:
        """One line: the invariant, the virtual time, what happened, and how to replay it."""
        where = f"{self.invariant} at t={self.at:.3f}s ({self.subject})"
        return f"{where}: {self.detail}; replay: {replay}"


def check(history: History) -> list[HistoryViolation]:
    """Every violation ``history`` shows, in order of the invariants, then of time."""
    found: list[HistoryViolation] = []
    found += _keys(history)
    found += _after_acknowledged(history)
    found += _holders(history)
    found += _tokens(history)
    found += _refusals(history)
    found += _ledger(history)
    found += _settled(history)
    found += [
        HistoryViolation("crashed", "-", history.ended_at, crash) for crash in history.crashes
    ]
    return found


def _by(writes: list[Write], key: str) -> dict[str, list[Write]]:
    grouped: dict[str, list[Write]] = defaultdict(list)
    for write in writes:
        grouped[getattr(write, key)].append(write)
    return grouped


def _keys(history: History) -> list[HistoryViolation]:
    found = []
    owner: dict[str, str] = {}
    for origin, writes in _by(history.writes, "origin").items():
        keys = sorted({w.key for w in writes})
        if len(keys) > 1:
            found.append(
                HistoryViolation(
                    "one_key_per_lifecycle",
                    origin,
                    writes[0].at,
                    f"its executions presented {len(keys)} idempotency keys: {', '.join(keys)}",
                )
            )
        for key in keys:
            other = owner.setdefault(key, origin)
            if other != origin:
                found.append(
                    HistoryViolation(
                        "one_key_per_lifecycle",
                        origin,
                        writes[0].at,
                        f"presented the idempotency key {key} of {other}",
                    )
                )
    return found


def _after_acknowledged(history: History) -> list[HistoryViolation]:
    found = []
    for write in history.writes:
        origin = history.origins.get(write.origin)
        acknowledged = origin.acknowledged_at if origin is not None else None
        if write.valid and acknowledged is not None and write.at > acknowledged:
            found.append(
                HistoryViolation(
                    "write_after_acknowledged",
                    write.origin,
                    write.at,
                    f"attempt {write.attempt_id[:12]} wrote step {write.step} after the queue "
                    f"heard 2xx at t={acknowledged:.3f}s",
                )
            )
    return found


def _holders(history: History) -> list[HistoryViolation]:
    found = []
    for resource, writes in _by(history.writes, "resource").items():
        finished: set[str] = set()
        current: str | None = None
        for write in sorted((w for w in writes if w.valid), key=lambda w: w.at):
            if write.attempt_id == current:
                continue
            if write.attempt_id in finished:
                found.append(
                    HistoryViolation(
                        "holders_interleave",
                        resource,
                        write.at,
                        f"attempt {write.attempt_id[:12]} of {write.origin} wrote again after "
                        f"attempt {(current or '')[:12]} had written, both holding their leases",
                    )
                )
            if current is not None:
                finished.add(current)
            current = write.attempt_id
        for write in writes:
            if write.valid and not write.accepted:
                found.append(
                    HistoryViolation(
                        "fenced_while_holding",
                        resource,
                        write.at,
                        f"attempt {write.attempt_id[:12]} of {write.origin} held its lease, and "
                        f"its token {write.token} was refused: another got a newer one",
                    )
                )
    return found


def _tokens(history: History) -> list[HistoryViolation]:
    found = []
    for resource, writes in _by(history.writes, "resource").items():
        seen: dict[int, str] = {}
        for write in writes:
            other = seen.setdefault(write.token, write.attempt_id)
            if other != write.attempt_id:
                found.append(
                    HistoryViolation(
                        "token_reused",
                        resource,
                        write.at,
                        f"attempts {other[:12]} and {write.attempt_id[:12]} both presented "
                        f"fencing token {write.token}",
                    )
                )
                seen[write.token] = write.attempt_id  # Report each new pair once.
    return found


def _refusals(history: History) -> list[HistoryViolation]:
    return [
        HistoryViolation(
            "refused_while_holding",
            refusal.origin,
            refusal.at,
            f"attempt {refusal.attempt_id[:12]} answered lost_claim while its lease held by "
            "its own clock: nothing can have taken it over",
        )
        for refusal in history.refusals
        if refusal.holding
    ]


def _ledger(history: History) -> list[HistoryViolation]:
    found = []
    rows: dict[str, int] = defaultdict(int)
    for row in history.ledger:
        rows[row.effect] += 1
    finals = {w.origin for w in history.writes if w.final and w.accepted}
    for name, origin in history.origins.items():
        if origin.transactional:
            if rows[name] > 1:
                found.append(
                    HistoryViolation(
                        "ledger_twice", name, history.ended_at, f"{rows[name]} ledger rows"
                    )
                )
            if origin.acknowledged_at is not None and rows[name] == 0:
                found.append(
                    HistoryViolation(
                        "acknowledged_without_effect",
                        name,
                        origin.acknowledged_at,
                        "acknowledged with no ledger row committed",
                    )
                )
        elif origin.acknowledged_at is not None and name not in finals and origin.resources == ():
            found.append(
                HistoryViolation(
                    "acknowledged_without_effect",
                    name,
                    origin.acknowledged_at,
                    "acknowledged, and no attempt made its final write",
                )
            )
    return found


def _settled(history: History) -> list[HistoryViolation]:
    return [
        HistoryViolation(
            "not_settled",
            name,
            history.ended_at,
            f"neither acknowledged nor given up after {origin.deliveries} deliveries",
        )
        for name, origin in history.origins.items()
        if origin.acknowledged_at is None and not origin.given_up
    ]
