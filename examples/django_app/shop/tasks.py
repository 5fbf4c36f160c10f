"""The shop's Django tasks: ``send_receipt`` runs once per order, however often Cloud Tasks
delivers it."""

from __future__ import annotations

try:
    from django.tasks import task  # Django 6
except ImportError:  # Python 3.11: Django 5.2 and the django-tasks backport
    from django_tasks import task

from shop.models import Order

sent: list[int] = []  # Stands in for a mail API.


@task  # type: ignore[untyped-decorator] # Django 6: untyped; the backport is typed.
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    sent.append(order.pk)
    Order.objects.filter(pk=order.pk).update(receipt_sent=True)
    return f"receipt for order {order.pk}"
