"""Whether a URL points at this machine, where plain http cannot be intercepted on the way."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["is_loopback_url"]


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` points at this machine (where plain http cannot be intercepted)."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
