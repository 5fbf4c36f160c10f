"""Cloud Tasks task IDs: deterministic for a key, hash first, within the platform's charset.

Task IDs allow letters, digits, ``-`` and ``_``, at most 500 characters; sequential IDs
(timestamps, counters, shared prefixes) raise latency for the whole queue, so the hash comes
first (docs/platform-facts.md, "creating tasks").
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid

MAX_TASK_ID_LENGTH = 500
# 32 hex digits = 128 bits: distinct (task_name, key) pairs never share an ID in practice.
HASH_HEX_DIGITS = 32
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+", re.ASCII)


def task_id(task_name: str, key: str) -> str:
    """The task ID for ``key``: the same every time, so Cloud Tasks de-duplicates re-enqueues.

    ``<32 hex digits of sha256(task_name, key)>-<task_name>-<key, made safe, cut to fit>``.
    The hash covers the exact pair, so the readable part may be cut or altered freely.
    """
    if not isinstance(key, str) or not key:
        raise ValueError("key must be a non-empty string")
    digest = hashlib.sha256(json.dumps([task_name, key]).encode()).hexdigest()[:HASH_HEX_DIGITS]
    return _with_readable_suffix(digest, f"{task_name}-{key}")


def random_task_id(task_name: str) -> str:
    """A unique task ID for an enqueue without a key: still named, so retrying the create
    cannot duplicate the task."""
    return _with_readable_suffix(uuid.uuid4().hex, task_name)


def _with_readable_suffix(prefix: str, readable: str) -> str:
    safe = _UNSAFE.sub("_", readable).strip("_") or "task"
    return f"{prefix}-{safe}"[:MAX_TASK_ID_LENGTH]
