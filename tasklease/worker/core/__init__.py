"""The worker's pure core: its rules as functions of records and times, and nothing else.

``decisions`` (claim, renew, finish, operator actions), ``locking`` (exclusive jobs and
concurrency keys), ``identity`` (a delivery's run key from its headers), ``records`` (the
records the stores keep), ``queries`` (listing filters and cursors), ``outcome`` (what the
worker did), ``endings`` (how a handler run ends) and ``constants`` (leases, retention,
clock skew, the headers Google sends).

The one rule of this folder (README.md beside this file): no I/O, no threads, no clock reads.
Time is an argument. Every store applies these rules through one primitive, so memory, SQLite
and Firestore decide alike, and the rules are tested with no store at all
(``tests/test_architecture.py`` holds the folder to it).
"""

__all__: list[str] = []
