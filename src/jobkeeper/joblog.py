"""Logs of every job's life, the first subscriber of the event seam.

A worker subscribes :func:`log_event` to its events while it runs, so every
outcome reaches the ``jobkeeper`` logger: failed attempts, dead letters and
rescues at WARNING with the job's id, task, queue, attempt and error;
cancellations and retries a task asked for (``Retry``) at INFO; claims,
starts, successes, hand-backs and acks at DEBUG. Each record also carries
those facts as attributes (``job_id``, ``task``, ``queue``, ``attempt``,
``duration``, ``error``, ``event``, ``outcome``, ``worker_id``) for
:class:`JsonFormatter` and any other formatter.

Also here: the worker's start line (:func:`log_start`) and the one-object-a-
line formatter behind ``jobkeeper worker --log-format json``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from jobkeeper.config import Settings
from jobkeeper.errors import JobkeeperError, Retry, printable, printable_json
from jobkeeper.events import EventBus, EventKind, JobEvent, OutcomeKind

#: The logger of job outcomes.
logger = logging.getLogger("jobkeeper")
_worker_logger = logging.getLogger("jobkeeper.worker")

#: Record attributes a job event sets, in the order JSON lines show them.
JOB_FIELDS = (
    "job_id", "task", "queue", "attempt", "duration", "error", "event", "outcome", "worker_id",
)  # fmt: skip

_FINISHED = {
    OutcomeKind.COMPLETED: (logging.DEBUG, "completed"),
    OutcomeKind.RETRIED: (logging.WARNING, "failed (it will be retried)"),
    OutcomeKind.DEAD: (logging.WARNING, "failed (no retry left)"),
    OutcomeKind.CANCELLED: (logging.INFO, "cancelled"),
    OutcomeKind.SNOOZED: (logging.DEBUG, "snoozed"),
    OutcomeKind.RELEASED: (logging.DEBUG, "handed back (the attempt not spent)"),
}
_OTHER = {
    EventKind.CLAIMED: (logging.DEBUG, "claimed"),
    EventKind.STARTED: (logging.DEBUG, "started"),
    EventKind.ACKED: (logging.DEBUG, "outcome written"),
    EventKind.CLAIM_LOST: (logging.INFO, "outcome refused: the claim was lost"),
    EventKind.RESCUED: (logging.WARNING, "taken back from a lost worker by a rescue"),
    EventKind.DEAD_LETTERED: (logging.WARNING, "moved to the dead letters"),
}


def _asked_retry(retry: Retry) -> tuple[int, str]:
    """A task that raised ``Retry`` asked for its retry: it did not fail (as
    Celery logs ``Task ... retry`` at INFO). Its delay is named: the error
    stored is only the reason.
    """
    when = "with the task's backoff" if retry.delay is None else f"in {retry.delay:g}s"
    return logging.INFO, f"will be retried {when}, as its task asked"


def _level_and_text(event: JobEvent) -> tuple[int, str]:
    if event.kind is EventKind.FINISHED and event.outcome is not None:
        if event.outcome is OutcomeKind.RETRIED and isinstance(event.exception, Retry):
            return _asked_retry(event.exception)
        return _FINISHED[event.outcome]
    return _OTHER.get(event.kind, (logging.DEBUG, event.kind.value))


def log_event(event: JobEvent) -> None:
    """Log one job event to the ``jobkeeper`` logger (an event listener)."""
    level, text = _level_and_text(event)
    if not logger.isEnabledFor(level):
        return
    # The task's name and the error come from the job: one line each, with
    # no control characters to forge another line or recolour a terminal.
    # The JSON format's fields keep them as they are (JSON escapes them).
    message = (
        f"job {event.job_id} ({printable(event.task)}, queue {event.queue}, "
        f"attempt {event.attempt}) {text}"
    )
    if event.kind is EventKind.RESCUED and event.worker_id:
        message += f" ({printable(event.worker_id)})"
    if event.duration is not None:
        # "ran", not "in": beside a retry's delay, "in 0.012s" read as when.
        message += f" (ran {event.duration:.3f}s)"
    if event.error:
        message += f": {printable(event.error)}"
    extra = {
        "job_id": event.job_id,
        "task": event.task,
        "queue": event.queue,
        "attempt": event.attempt,
        "duration": event.duration,
        "error": event.error,
        "event": event.kind.value,
        "outcome": event.outcome.value if event.outcome is not None else None,
        # Which worker: once logs are gathered, a line must say where it came
        # from (a rescue's names the lost holder).
        "worker_id": event.worker_id,
    }
    logger.log(level, "%s", message, extra=extra)


# Buses with the log listener on, and how many running workers want it:
# two workers of one JobQueue must not log each event twice.
_installed: weakref.WeakKeyDictionary[EventBus, tuple[int, Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)
_installed_lock = threading.Lock()
# logging.raiseExceptions as it was before the first running worker (see
# install()); _installed is empty when none runs.
_raise_before = True


def logged_kinds() -> frozenset[EventKind]:
    """The events whose records the ``jobkeeper`` logger would keep now:
    outcomes, lost claims, rescues and dead letters always (they log at INFO
    or above), claims, starts and acks only while DEBUG is on. Only those
    are built: a job that completes costs one event, not four.
    """
    kinds = {EventKind.FINISHED, EventKind.CLAIM_LOST, EventKind.RESCUED, EventKind.DEAD_LETTERED}
    if logger.isEnabledFor(logging.DEBUG):
        kinds |= {EventKind.CLAIMED, EventKind.STARTED, EventKind.ACKED}
    return frozenset(kinds)


def logged_outcomes() -> frozenset[OutcomeKind]:
    """The outcomes of FINISHED events the logger would keep now: failures
    and cancellations always, successes, snoozes and hand-backs only while
    DEBUG is on (a busy worker's events are mostly successes: none is built
    to be dropped).
    """
    return frozenset(o for o, (level, _) in _FINISHED.items() if logger.isEnabledFor(level))


def install(bus: EventBus) -> Callable[[], None]:
    """Log ``bus``'s events (once, however many workers ask); returns the
    function that takes this request back.

    While any worker runs, ``logging.raiseExceptions`` is False, as Python's
    logging docs advise for production: a handler that fails (its stream
    closed by a task's ``sys.stderr.close()``) then drops the record, where
    its error report raised out of the logging call and stopped the worker
    thread that logged, leaving its job running under a live heartbeat.
    """
    global _raise_before
    with _installed_lock:
        if not _installed:
            _raise_before = logging.raiseExceptions
            logging.raiseExceptions = False
        entry = _installed.get(bus)
        if entry is None:
            entry = (0, bus.subscribe(log_event, logged_kinds(), outcomes=logged_outcomes()))
        _installed[bus] = (entry[0] + 1, entry[1])
    done = threading.Event()

    def uninstall() -> None:
        if done.is_set():
            return
        done.set()
        with _installed_lock:
            count, unsubscribe = _installed[bus]
            if count > 1:
                _installed[bus] = (count - 1, unsubscribe)
                return
            del _installed[bus]
            if not _installed:
                logging.raiseExceptions = _raise_before
        unsubscribe()

    return uninstall


class _TaskLike(Protocol):
    queue: str


def _never_raises(log: Callable[..., None]) -> Callable[..., None]:
    """The worker's own lines around its start and stop: a log handler
    that raises from ``emit`` (against logging's protocol, where a failing
    handler calls ``handleError``) must not fail the worker's start, or
    make ``run_worker`` raise after a clean stop.
    """

    @functools.wraps(log)
    def logged(*args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(Exception):
            log(*args, **kwargs)

    return logged


@_never_raises
def log_start(
    *,
    worker_id: str,
    database: str,
    queues: Sequence[str],
    concurrency: int,
    prefetch: int | None,
    settings: Settings,
    tasks: Mapping[str, _TaskLike],
) -> None:
    """The worker's start line (INFO on ``jobkeeper.worker``): its database
    (``database`` must already be redacted), queues and settings; and a
    WARNING per served queue that none of the app's tasks names as its
    queue (a typo in ``--queue``, or a task that moved).
    """
    knobs = " ".join(
        f"{name}={getattr(settings, name)!r}"
        for name in (
            "heartbeat_interval",
            "rescue_after",
            "poll_interval",
            "retention",
            "shutdown_grace",
            "max_payload_bytes",
        )
    )
    _worker_logger.info(
        "worker %s started on %s: queues=%s concurrency=%d prefetch=%s %s",
        worker_id,
        database,
        ",".join(queues),
        concurrency,
        "adaptive" if prefetch is None else prefetch,
        knobs,
    )
    if not tasks:
        return
    used = {task.queue for task in tasks.values()}
    for queue in queues:
        if queue not in used:
            _worker_logger.warning(
                "queue %r is served by this worker but none of the app's tasks uses it "
                "(tasks use: %s); jobs there are enqueued only with an explicit queue=",
                queue,
                ", ".join(sorted(used)),
            )


class _StopTally(Protocol):
    claimed: int
    completed: int
    failed: int
    snoozed: int
    cancelled: int
    released: int


@_never_raises
def log_stopped_on_error(*, worker_id: str, error: Exception) -> None:
    """The worker's ERROR line when its start or run ends on ``error`` (the
    caller hears of it too, but a log pipeline reading only the worker's
    records must see why it ended); the traceback when it is not one of
    jobkeeper's errors.
    """
    if isinstance(error, JobkeeperError):
        _worker_logger.error("worker %s stopped on an error: %s", worker_id, error)
    else:
        _worker_logger.error("worker %s stopped on an unexpected error", worker_id, exc_info=error)


@_never_raises
def log_stop(*, worker_id: str, started: bool, tally: _StopTally, left_held: int) -> None:
    """The worker's stop line (INFO on ``jobkeeper.worker``): its tally and
    ``left_held``, the jobs it still holds in the database (code that would
    not return, outcomes it could not write: rescued later); for a worker
    that never ``started`` (registered), that it stopped before its start
    instead: no "started" line came, and a tally of zeros would read as a
    worker that ran.
    """
    if not started:
        _worker_logger.info("worker %s stopped before it started: no job was claimed", worker_id)
        return
    _worker_logger.info(
        "worker %s stopped: %d claimed, %d completed, %d failed, %d snoozed, %d cancelled, "
        "%d handed back, %d left held",
        worker_id,
        tally.claimed,
        tally.completed,
        tally.failed,
        tally.snoozed,
        tally.cancelled,
        tally.released,
        left_held,
    )


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (ISO 8601, UTC), ``level``,
    ``logger``, ``message``, then each of :data:`JOB_FIELDS` the record
    carries, and ``exception`` with the traceback when there is one.
    """

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            if name in record.__dict__:
                line[name] = record.__dict__[name]
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted already, on the thread that logged
            line["exception"] = record.exc_text
        return printable_json(json.dumps(line, default=str, ensure_ascii=False))
