"""Where a task goes: its HttpRequest, rewritten by its queue's ``httpTarget``. Pure.

Cloud Tasks' queue-level HttpTarget (google.cloud.tasks_v2.types.HttpTarget) overrides, at
execution time, every HTTP task of the queue: ``uriOverride`` replaces parts of the URL
(``ALWAYS``, the default, or only where the task's URL lacks them, ``IF_NOT_EXISTS``),
``httpMethod`` the method (a GET drops the body), ``headerOverrides`` set headers, and an
``oidcToken`` replaces the task's token.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_BODYLESS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Route:
    """The request one attempt sends."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    service_account: str | None  # Mint an OIDC token for this account, if set.
    audience: str | None


def route(http: dict[str, Any], target: dict[str, Any] | None) -> Route:
    """The request for a task's ``httpRequest`` (REST JSON) in a queue with ``httpTarget``."""
    target = target or {}
    method = http.get("httpMethod", "POST")
    if target.get("httpMethod", "HTTP_METHOD_UNSPECIFIED") != "HTTP_METHOD_UNSPECIFIED":
        method = target["httpMethod"]
    url = (
        override_url(http["url"], target["uriOverride"]) if "uriOverride" in target else http["url"]
    )
    headers = dict(http.get("headers") or {})
    for override in target.get("headerOverrides", []):
        header = override.get("header", {})
        key = header.get("key", "")
        for existing in [k for k in headers if k.lower() == key.lower()]:
            del headers[existing]
        headers[key] = header.get("value", "")
    body = b"" if method in _BODYLESS else base64.b64decode(http.get("body") or "")
    oidc = target.get("oidcToken") or http.get("oidcToken") or {}
    account = oidc.get("serviceAccountEmail") or None
    return Route(method, url, headers, body, account, oidc.get("audience") or url)


def override_url(url: str, override: dict[str, Any]) -> str:
    """``url`` with the parts ``override`` (a UriOverride as REST JSON) replaces."""
    parts = urlsplit(url)
    only_missing = override.get("uriOverrideEnforceMode") == "IF_NOT_EXISTS"
    scheme, host, port = parts.scheme, parts.hostname or "", parts.port
    path, query = parts.path, parts.query
    if "scheme" in override and not only_missing:
        scheme = str(override["scheme"]).lower()
    if "host" in override and not only_missing:
        host = override["host"]
    if "port" in override and (not only_missing or port is None):
        port = int(override["port"]) or None  # 0 clears the port.
    if "pathOverride" in override and (not only_missing or path in ("", "/")):
        path = override["pathOverride"].get("path", "")
    if "queryOverride" in override and (not only_missing or not query):
        query = override["queryOverride"].get("queryParams", "")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    return urlunsplit((scheme, netloc, path, query, ""))
