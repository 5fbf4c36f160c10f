"""Which ``Host`` headers a local server answers: loopback names, its bind host, and names
configured for it. A page that rebinds its own name to 127.0.0.1 (DNS rebinding) still sends
that name, so answering only these keeps it out. Shared by the emulator and the dashboard.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - recognised, not bound
# host, [v6 host], with an optional port; nothing else may be in a Host header.
_HOST_HEADER = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::\d{1,5})?")


def allowed_host_names(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """Loopback names, the host the server binds to (unless a wildcard) and ``extra``."""
    names = {bind_host.strip("[]").lower()} - WILDCARD_HOSTS
    return LOOPBACK_HOSTS | names | {name.strip("[]").lower() for name in extra}


def host_name(header: str) -> str | None:
    """The lower-cased host of a Host header without its port; None if it is malformed."""
    match = _HOST_HEADER.fullmatch(header)
    if match is None:
        return None
    return (match.group("v6") or match.group("name")).lower()
