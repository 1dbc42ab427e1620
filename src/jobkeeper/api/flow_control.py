"""Flow control of :class:`~jobkeeper.JobQueue`: pausing a queue and setting
the limits the database holds for all workers together.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from jobkeeper.api.base import QueueBase
from jobkeeper.config import check_name
from jobkeeper.models import JobStatus, QueueCounts
from jobkeeper.queues import (
    UNSET,
    QueueInfo,
    QueueSettings,
    Unset,
    check_concurrency,
    check_max_pending,
    enforces_queue_settings,
    parse_rate_limit,
)

logger = logging.getLogger("jobkeeper")


class FlowControlMixin(QueueBase):
    """Pause, resume and configure_queue of :class:`~jobkeeper.JobQueue`."""

    def pause(self, queue: str) -> QueueInfo:
        """Stop every worker from starting jobs of ``queue`` (running jobs
        finish). Persistent: it holds through restarts until :meth:`resume`.
        Warns (``UserWarning``) while a registered worker runs a jobkeeper too
        old to obey it.

        Raises:
            ConfigError: a bad queue name.
        """
        return self._configure(queue, {"paused": True})

    def resume(self, queue: str) -> QueueInfo:
        """Let workers start jobs of ``queue`` again (see :meth:`pause`).

        Raises:
            ConfigError: a bad queue name.
        """
        return self._configure(queue, {"paused": False})

    def configure_queue(
        self,
        queue: str,
        *,
        concurrency: int | Unset | None = UNSET,
        rate_limit: str | Unset | None = UNSET,
        max_pending: int | Unset | None = UNSET,
    ) -> QueueInfo:
        """Set flow-control limits of ``queue``, held by the database for all
        workers together; only the settings given change, and ``None`` lifts
        one. Warns (``UserWarning``) while a registered worker runs a
        jobkeeper too old to obey them.

        Args:
            queue: the queue's name.
            concurrency: most jobs of the queue held (claimed or running) at
                once across all workers (>= 1; pause to stop a queue).
            rate_limit: most starts per period across all workers, as
                ``"N/s"``, ``"N/m"`` or ``"N/h"``, in every sliding window.
            max_pending: most scheduled, available, claimed and retryable
                jobs; an enqueue past it raises :class:`~jobkeeper.QueueFull`.

        Returns:
            The queue as :meth:`queues` reports it.

        Raises:
            ConfigError: a bad name or value (nothing is changed).
        """
        changes: dict[str, Any] = {}
        if not isinstance(concurrency, Unset):
            changes["concurrency"] = None if concurrency is None else check_concurrency(concurrency)
        if not isinstance(rate_limit, Unset):
            changes["rate_limit"] = None if rate_limit is None else parse_rate_limit(rate_limit)
        if not isinstance(max_pending, Unset):
            changes["max_pending"] = None if max_pending is None else check_max_pending(max_pending)
        return self._configure(queue, changes)

    def _configure(self, queue: str, changes: dict[str, Any]) -> QueueInfo:
        check_name("queue", queue)
        if changes:
            settings = self.backend.queue_configure(name=queue, changes=changes)
            if settings.limits_claims or settings.max_pending is not None:
                self._warn_old_workers(queue)
        else:
            found = self.backend.queue_settings_list(names=[queue])
            settings = found[0] if found else QueueSettings(queue)
        # Never every finished row for one queue's line: stats() took 150-240
        # ms a pause at 1M retained rows, and a recount fails where a
        # statement_timeout is shorter than it, after the change committed.
        # Nor every queue's live rows: 0.3-1.0 s at 600k available jobs.
        counted = self.backend.queue_counts_of(queue=queue, exact_below=100_000)
        per_status = counted.counts.get(queue, {})
        return queue_info(
            settings, {s.value: per_status.get(s.value, 0) for s in JobStatus}, counted
        )

    def _warn_old_workers(self, queue: str) -> None:
        """Warn when a registered worker cannot obey queue settings."""
        old = [w for w in self.backend.worker_list() if not enforces_queue_settings(w.version)]
        if not old:
            return
        shown = ", ".join(f"{w.id} ({w.version or 'no version'})" for w in old[:3])
        more = f" and {len(old) - 3} more" if len(old) > 3 else ""
        message = (
            f"queue {queue!r}: {len(old)} registered worker(s) run a jobkeeper older than "
            f"flow control and will ignore its settings: {shown}{more}"
        )
        logger.warning("%s", message)
        # The caller of pause(), resume() or configure_queue().
        warnings.warn(message, UserWarning, stacklevel=4)


def queue_info(settings: QueueSettings, counts: dict[str, int], counted: QueueCounts) -> QueueInfo:
    return QueueInfo(
        name=settings.name,
        paused=settings.paused,
        concurrency=settings.concurrency,
        rate_limit=settings.rate_text,
        max_pending=settings.max_pending,
        counts=dict(counts),
        estimated=tuple(sorted(counted.estimated)),
        lower_bound=tuple(sorted(counted.lower_bound)),
    )
