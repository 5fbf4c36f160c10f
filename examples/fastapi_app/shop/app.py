"""``uvicorn --factory shop.app:create_app``: the API and the worker in one ASGI app.

The worker's store and authentication come from the ``TASKLEASE_*`` variables; the producer
behind ``send_receipt.enqueue`` too (``TASKLEASE_WORKER_URL`` ends in ``/worker``: the mount).
"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from shop.tasks import router, send_receipt
from tasklease.worker.asgi import create_asgi_app


class NewOrder(BaseModel):
    order_id: int


def create_app() -> FastAPI:
    app = FastAPI()

    @app.post("/orders")
    def place_order(order: NewOrder) -> dict[str, bool]:
        """A plain ``def`` endpoint: FastAPI runs it in a thread, where the (blocking)
        producer may wait on Cloud Tasks. A retried request creates no second task: the
        key names it."""
        result = send_receipt.enqueue({"order_id": order.order_id}, key=f"order-{order.order_id}")
        return {"created": result.created}

    app.mount("/worker", create_asgi_app(router))
    return app
