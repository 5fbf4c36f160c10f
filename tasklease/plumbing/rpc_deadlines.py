"""Deadlines for the RPCs of a Google API client (Firestore's, Spanner's), when a call sets
none.

Google's generated clients call each RPC through the wrapper their transport made for it,
with the default retry and timeout of the method's configuration: up to an hour for some
(``spanner_v1/services/spanner/transports/base.py``: ``default_timeout=3600.0``), 60 s for
Firestore's transaction RPCs, so a frozen database would hold a request that long. The
transports name no public way to change those defaults, so :func:`bound_rpcs` replaces the
wrappers in the transport's table of them (``_wrapped_methods``, built by
``_prep_wrapped_messages`` in every generated ``transports/base.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from google.api_core import gapic_v1


def bound_rpcs(
    transport: Any, retry: Any, timeout: float, methods: Iterable[str] | None = None
) -> None:
    """Give the RPCs ``methods`` names (every one, by default) of ``transport`` ``retry``
    and a deadline of ``timeout`` seconds, unless a call sets its own. Bounding again
    replaces the earlier bound, never wraps it; the same ``timeout`` again changes nothing."""
    state = transport.__dict__
    if state.get("tasklease_bound_rpcs") == (timeout, methods):
        return
    table = transport._wrapped_methods  # noqa: SLF001 - no public way, see the module's doc.
    originals = state.setdefault("tasklease_unbounded_rpcs", {})
    keys = list(table) if methods is None else [getattr(transport, name) for name in methods]
    for key in keys:
        original = originals.setdefault(key, table[key])
        table[key] = _bounded(original, retry, timeout)
    state["tasklease_bound_rpcs"] = (timeout, methods)


def _bounded(wrapped: Callable[..., Any], retry: Any, timeout: float) -> Callable[..., Any]:
    def call(
        *args: Any, retry: Any = gapic_v1.method.DEFAULT, timeout: Any = gapic_v1.method.DEFAULT,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        return wrapped(
            *args,
            retry=bounded_retry if retry is gapic_v1.method.DEFAULT else retry,
            timeout=bounded_timeout if timeout in (gapic_v1.method.DEFAULT, None) else timeout,
            **kwargs,
        )

    bounded_retry, bounded_timeout = retry, timeout
    return call
