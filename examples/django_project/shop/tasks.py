"""The shop's background tasks, written against Django's task API only."""

try:  # Django >= 6.0
    from django.tasks import task
except ImportError:  # the django-tasks backport
    from django_tasks import task

from shop.models import Order


@task(queue_name="emails")
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    order.receipt_sent = True
    order.save(update_fields=["receipt_sent"])
    return f"receipt sent to {order.email}"


@task(takes_context=True, priority=10)
def attempts_so_far(context) -> int:
    return context.attempt


class PaymentDeclined(Exception):
    pass


@task()
def charge(amount: int) -> None:
    raise PaymentDeclined(f"declined: {amount}")
