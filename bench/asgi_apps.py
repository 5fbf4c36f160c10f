"""The servers bench/asgi_throughput.py compares, under one uvicorn configuration.

``bare`` is a plain Starlette route doing the handler's work on the loop (``async def``);
``bare_oidc`` is the same route verifying the request's OIDC ID token first, by google-auth's
``id_token.verify_token`` with the public keys cached (``Cache-Control``), the issuer, the
verified email and the allow-list checked: the check a Starlette service that takes Cloud
Tasks' deliveries has to make itself. ``tasklease`` (a factory) serves the same work through
tasklease.worker.asgi with ``BENCH_AUTH`` (``none``, the default; ``oidc``, configured from
the ``TASKLEASE_*`` variables a deployment sets) on the store ``BENCH_STORE`` names
(``memory``, the default; ``sqlite``, the file in ``BENCH_DB``; ``postgres``, the store URL in
``BENCH_DB``), by the ``async def`` twin of bench.throughput_apps' handler, or by the sync
handler itself with ``BENCH_HANDLER=sync``. ``bare_oidc`` and tasklease with ``oidc`` read the
same ``TASKLEASE_AUDIENCE``, ``TASKLEASE_ALLOWED_SERVICE_ACCOUNTS`` and
``TASKLEASE_OIDC_CERTS_URL``.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench.throughput_apps import async_router, router, work
from tasklease.worker.asgi import AsgiDeliveries, create_asgi_app
from tasklease.worker.stores import LeaseStore, MemoryStore, SqliteStore, store_from_url

PATH = "/tasks/noop"


async def noop(request: Request) -> JSONResponse:
    return JSONResponse(work(await request.json()))


def bare() -> Starlette:
    """The bare route's app, without authentication (``--factory``, as the worker's is)."""
    return Starlette(routes=[Route(PATH, noop, methods=["POST"])])


def bare_oidc() -> Starlette:
    """The bare route behind the token check a deployment needs (``--factory``)."""
    import cachecontrol  # noqa: PLC0415 - loaded by the servers that verify tokens only.
    import google.auth.exceptions  # noqa: PLC0415
    import google.auth.transport.requests  # noqa: PLC0415
    import requests  # noqa: PLC0415
    from google.oauth2 import id_token  # noqa: PLC0415

    audience = os.environ["TASKLEASE_AUDIENCE"]
    allowed = frozenset(os.environ["TASKLEASE_ALLOWED_SERVICE_ACCOUNTS"].split(","))
    certs_url = os.environ["TASKLEASE_OIDC_CERTS_URL"]
    # The keys come through an HTTP cache, google-auth's own recipe (google.oauth2.id_token,
    # https://googleapis.dev/python/google-auth/latest/reference/google.oauth2.id_token.html)
    # and what tasklease's KeyFetcher does: without it every verification fetches them.
    transport = google.auth.transport.requests.Request(
        session=cachecontrol.CacheControl(requests.Session())
    )
    issuers = ("accounts.google.com", "https://accounts.google.com")

    async def verified(request: Request) -> JSONResponse:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return JSONResponse({"status": "unauthenticated"}, status_code=401)
        try:
            claims: dict[str, Any] = dict(
                id_token.verify_token(
                    token.strip(),
                    transport,
                    audience=[audience, audience + PATH],
                    certs_url=certs_url,
                    clock_skew_in_seconds=30,
                )
            )
        except (ValueError, google.auth.exceptions.GoogleAuthError):
            return JSONResponse({"status": "unauthenticated"}, status_code=401)
        if claims.get("iss") not in issuers:
            return JSONResponse({"status": "unauthenticated"}, status_code=401)
        if claims.get("email_verified") is not True or claims.get("email") not in allowed:
            return JSONResponse({"status": "forbidden"}, status_code=403)
        return await noop(request)

    return Starlette(routes=[Route(PATH, verified, methods=["POST"])])


def _store() -> LeaseStore:
    kind = os.environ.get("BENCH_STORE", "memory")
    if kind == "memory":
        return MemoryStore()
    if kind == "postgres":
        return store_from_url(os.environ["BENCH_DB"])
    return SqliteStore(os.environ["BENCH_DB"])


def tasklease() -> AsgiDeliveries:
    """The worker on the store, auth and handler the environment names (``uvicorn --factory``)."""
    handlers = router if os.environ.get("BENCH_HANDLER") == "sync" else async_router
    return create_asgi_app(handlers, store=_store(), auth=os.environ.get("BENCH_AUTH", "none"))
