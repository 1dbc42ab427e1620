"""The shop's tests (``python manage.py test``): the jobs run in the test
process with ``jobkeeper.testing.drain``, on Django's test database.

``TransactionTestCase``, not ``TestCase``: an enqueue joins the test's
transaction, which ``TestCase`` never commits, so a worker's own connections
would not see the job.
"""

from django.test import Client, TransactionTestCase

from jobkeeper.testing import drain
from shop.models import Order
from shop.tasks import send_receipt

try:  # Django >= 6.0
    from django.tasks import task, task_backends
except ImportError:  # the django-tasks backport
    from django_tasks import task, task_backends


@task()
def count_orders() -> int:
    return Order.objects.count()


@task()
def count_later() -> str:
    """Enqueues a follow-up job from inside a job."""
    return count_orders.enqueue().id


class ReceiptTests(TransactionTestCase):
    def test_an_order_gets_its_receipt(self) -> None:
        placed = Client().post(
            "/orders/", {"email": "t@example.com"}, content_type="application/json"
        )
        drain(task_backends["default"].queue)
        self.assertTrue(Order.objects.get().receipt_sent)
        result = send_receipt.get_result(placed.json()["task"])
        self.assertEqual(result.status, "SUCCESSFUL")
        self.assertEqual(result.return_value, "receipt sent to t@example.com")

    def test_a_failed_order_leaves_no_job(self) -> None:
        failed = Client(raise_request_exception=False).post(
            "/orders/", {"email": "f@example.com", "fail": True}, content_type="application/json"
        )
        self.assertEqual(failed.status_code, 500)
        self.assertEqual(drain(task_backends["default"].queue), {})


class FollowUpTests(TransactionTestCase):
    def test_a_job_enqueued_by_a_job_runs_on_the_test_database(self) -> None:
        Order.objects.create(email="c@example.com")
        outer = count_later.enqueue()
        drain(task_backends["default"].queue)
        inner = count_orders.get_result(count_later.get_result(outer.id).return_value)
        self.assertEqual([inner.status, inner.return_value], ["SUCCESSFUL", 1])
