"""The API users hold: :class:`JobQueue`, one mixin per concern in this
package's modules (enqueue, results, operations, running, periodics), over
the state they share (:mod:`jobkeeper.api.base`).
"""

from jobkeeper.api.base import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from jobkeeper.api.queue import JobQueue

__all__ = ["DEFAULT_MAX_ATTEMPTS", "DEFAULT_QUEUE", "JobQueue"]
