"""``POST /orders``: the order and its receipt task commit together, or neither does."""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from shop.models import Order
from shop.tasks import send_receipt


@csrf_exempt  # type: ignore[untyped-decorator] # A JSON API: no cookie session.
@require_POST  # type: ignore[untyped-decorator]
def place_order(request: HttpRequest) -> JsonResponse:
    total = json.loads(request.body)["total"]
    with transaction.atomic():
        order = Order.objects.create(total=total)
        result = send_receipt.enqueue(order.pk)  # Staged in the outbox, in this transaction.
        if total <= 0:
            transaction.set_rollback(True)  # No order, so no receipt: nothing is sent.
            return JsonResponse({"error": "a total must be positive"}, status=400)
    return JsonResponse({"order": order.pk, "task": result.id}, status=201)
