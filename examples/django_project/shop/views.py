import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from shop.models import Order
from shop.tasks import send_receipt

try:  # Django >= 6.0
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # the django-tasks backport
    from django_tasks.exceptions import TaskResultDoesNotExist


@csrf_exempt
def place_order(request: HttpRequest) -> JsonResponse:
    """Create an order and enqueue its receipt in one transaction: if the
    request fails after the enqueue, neither the order nor the job exists.
    """
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(email=body["email"])
        result = send_receipt.enqueue(order_id=order.pk)
        if body.get("fail"):
            raise ValueError("the order failed after its receipt was enqueued")
    return JsonResponse({"order": order.pk, "task": result.id})


def task_status(request: HttpRequest, result_id: str) -> JsonResponse:
    try:
        result = send_receipt.get_result(result_id)
    except TaskResultDoesNotExist:  # never enqueued, or pruned after its retention
        return JsonResponse({"error": f"no task {result_id}"}, status=404)
    body = {"status": str(result.status)}
    if result.is_finished and result.status == "SUCCESSFUL":
        body["return_value"] = result.return_value
    return JsonResponse(body)
