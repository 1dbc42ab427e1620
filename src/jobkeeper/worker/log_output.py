"""Where ``jobkeeper worker`` writes its log (and ``run_worker`` when the
process set up no logging, see :func:`log_unless_configured`): stderr,
through a thread of its own, so that a stream that stops taking lines never
stops the worker.

A worker that logs straight to stderr blocks inside the write once the pipe
behind it is full (a log shipper, journald or docker that stopped reading).
Every thread that logs then blocks: runner threads reporting their jobs'
ends, so outcomes are never written, while the heartbeat thread, which logs
nothing, keeps the held jobs from being rescued; and the SIGTERM handler's
own line, so the worker cannot even stop. Here a logging call formats its
line, as a ``StreamHandler`` would, and only queues it
(``queue.SimpleQueue``, safe in a signal handler); a writer thread writes
what is queued, many lines per write. Past :data:`MAX_QUEUED` lines or
:data:`MAX_QUEUED_CHARS` characters waiting, new lines are dropped and
counted, and the writer says how many once the stream takes lines again.
This is the "non-blocking handler" pattern of Python's logging cookbook
(a queue, and a thread that writes what it holds), with a bound.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import sys
import threading
import time
from types import TracebackType
from typing import TextIO

from jobkeeper.context import bound_job

#: The format of the worker's text log lines (``--log-format text``).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Lines waiting for the writer past which new ones are dropped.
MAX_QUEUED = 10_000
#: Characters waiting for the writer past which new lines are dropped: a
#: task logging 100 kB lines took a worker to 1 GB behind a stalled stderr
#: with the line count alone.
MAX_QUEUED_CHARS = 16_000_000
#: Lines the writer joins into one write.
WRITE_BATCH = 1_000
#: Seconds the writer gets at exit to write what is queued (a stream that
#: takes nothing must not keep the process from exiting).
FLUSH_AT_EXIT = 2.0

#: What the writer's queue holds: a line; an Event to set once every line
#: queued before it is written (:meth:`StreamWriter.flush_within`); None to stop.
Queued = str | threading.Event | None
#: The writer :func:`log_unless_configured` started for ``run_worker``, if any.
_installed: StreamWriter | None = None
#: Every writer :func:`log_to_stderr` started in this process.
_writers: list[StreamWriter] = []


class JobFields(logging.Filter):
    """Adds the running job's ``job_id``, ``task``, ``queue`` and ``attempt``
    to what a task's own code logs, as the worker's lines about the job carry
    them (the JSON format writes them as fields). Runs on the thread that
    logs, where :func:`jobkeeper.current_job` knows the job (a thread the
    task starts itself does not inherit it).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        if "job_id" not in fields:
            job = bound_job()
            if job is not None:
                fields.update(job_id=job.id, task=job.task, queue=job.queue, attempt=job.attempt)
        return True


class _NoLock:
    """The lock of a handler that needs none (its queue is thread-safe).

    ``Handler.handle`` takes the handler's lock around ``emit``; on Python
    3.11 through ``acquire``/``release``, Python functions at whose entry an
    asynchronous exception can land: a task interrupted (timeout, shutdown)
    while logging then left the lock held, and every other thread that
    logged, the stop's included, waited on it for ever.
    """

    def acquire(self, *args: object) -> bool:
        return True

    def release(self) -> None:
        return None

    def __enter__(self) -> bool:
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


class DroppingLineHandler(logging.Handler):
    """Formats each record on the thread that logs and queues its line for
    :class:`StreamWriter`; never blocks and takes no lock (see the module).

    The counts are plain integers each written by one side: the characters
    and lines queued and dropped by the logging threads, the characters
    written by the writer. A logging thread's increment can be lost to
    another's at the same instant; the bound and the count are then off by
    a line, which is better than a lock in a logging call.
    """

    def __init__(self, lines: queue.SimpleQueue[Queued], formatter: logging.Formatter) -> None:
        super().__init__()
        self._lines = lines
        self.setFormatter(formatter)
        self.queued_chars = 0
        self.written_chars = 0
        self.dropped = 0

    def createLock(self) -> None:  # noqa: N802 - logging.Handler names it
        self.lock = _NoLock()  # type: ignore[assignment]

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:  # noqa: BLE001 - a record that cannot be formatted
            self.handleError(record)
            return
        waiting = self.queued_chars - self.written_chars
        if self._lines.qsize() >= MAX_QUEUED or waiting + len(line) > MAX_QUEUED_CHARS:
            self.dropped += 1
            return
        self.queued_chars += len(line)
        self._lines.put_nowait(line)


class StreamWriter:
    """Writes the queued lines to ``stream``, many per write, first saying
    how many were dropped since it last wrote.

    It writes itself rather than through a ``logging.StreamHandler``:
    ``logging.shutdown`` flushes every handler at exit under the handler's
    lock, which a write stuck on a full pipe holds, and the process would
    never exit.
    """

    def __init__(
        self,
        lines: queue.SimpleQueue[Queued],
        source: DroppingLineHandler,
        stream: TextIO,
    ) -> None:
        self._lines = lines
        self._source = source
        self._stream = stream
        self._reported = 0
        self._writing: threading.Thread | None = None

    def start(self) -> None:
        """Start the writer thread."""
        self._writing = threading.Thread(target=self._run, name="jobkeeper-log-writer", daemon=True)
        self._writing.start()

    def _run(self) -> None:
        while True:
            item = self._lines.get()
            batch: list[str] = []
            flushed: list[threading.Event] = []
            while True:
                if item is None:
                    self._write(batch)
                    for done in flushed:
                        done.set()
                    return
                if isinstance(item, threading.Event):
                    flushed.append(item)
                else:
                    batch.append(item)
                if len(batch) >= WRITE_BATCH:
                    break
                try:
                    item = self._lines.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._write(batch)
            for done in flushed:
                done.set()

    def _write(self, batch: list[str]) -> None:
        dropped = self._source.dropped - self._reported
        if dropped > 0:
            self._reported += dropped
            batch.insert(0, self._dropped_line(dropped))
        text = "".join(batch)
        # A stream a task closed costs these lines, never the writer thread.
        with contextlib.suppress(Exception):
            self._stream.write(text)
            self._stream.flush()
        self._source.written_chars += len(text)

    def _dropped_line(self, dropped: int) -> str:
        record = logging.makeLogRecord(
            {
                "name": "jobkeeper.worker",
                "levelno": logging.WARNING,
                "levelname": "WARNING",
                "msg": f"{dropped} log lines dropped: stderr did not take them as fast as "
                f"they came (more than {MAX_QUEUED} lines or {MAX_QUEUED_CHARS // 1_000_000} "
                "MB were waiting)",
            }
        )
        return self._source.format(record) + "\n"

    def flush_within(self, timeout: float) -> None:
        """Wait until every line queued so far is written, for up to
        ``timeout`` seconds; the writer goes on.
        """
        if self._writing is None:
            return
        done = threading.Event()
        self._lines.put_nowait(done)
        done.wait(timeout)

    def stop_within(self, timeout: float) -> None:
        """Write what is queued, for up to ``timeout`` seconds, then stop."""
        writing, self._writing = self._writing, None
        if writing is None:
            return
        self._lines.put_nowait(None)
        writing.join(timeout)


def log_to_stderr(
    level: int, formatter: logging.Formatter, stream: TextIO | None = None
) -> StreamWriter | None:
    """Make the root logger write at ``level`` with ``formatter`` to
    ``stream`` (default: ``sys.stderr``) through a writer thread (see the
    module); what is queued is written at exit, for up to
    :data:`FLUSH_AT_EXIT` seconds. Like ``logging.basicConfig``, it does
    nothing when the root logger has handlers already (the process set up
    its own logging). Returns the writer (``stop_within`` ends it), or None.
    """
    if logging.getLogger().handlers:
        return None
    lines: queue.SimpleQueue[Queued] = queue.SimpleQueue()
    handler = DroppingLineHandler(lines, formatter)
    handler.addFilter(JobFields())
    writer = StreamWriter(lines, handler, sys.stderr if stream is None else stream)
    writer.start()
    _writers.append(writer)
    atexit.register(writer.stop_within, FLUSH_AT_EXIT)
    logging.basicConfig(level=level, handlers=[handler])
    return writer


def log_unless_configured() -> StreamWriter | None:
    """For a worker run from Python (``jq.run_worker()``): when neither the
    ``jobkeeper`` logger nor the root logger has a handler (a plain script
    that set up no logging), log as ``jobkeeper worker`` does by default:
    INFO and up, in :data:`TEXT_FORMAT`, to stderr, through
    :func:`log_to_stderr`. Without this such a worker printed nothing: not
    its start, not a failed job (the way ``uvicorn.run`` and Celery's
    ``worker_main`` set up their own logging). Logging the process set up
    (any handler on either logger) is left alone.

    Returns:
        The writer (see :func:`log_to_stderr`), or None when logging was
        already set up.
    """
    global _installed
    if logging.getLogger("jobkeeper").handlers or logging.getLogger().handlers:
        return None
    _installed = log_to_stderr(logging.INFO, logging.Formatter(TEXT_FORMAT))
    return _installed


def flush_installed() -> None:
    """Write what the writer :func:`log_unless_configured` started holds, for
    up to :data:`FLUSH_AT_EXIT` seconds: when ``run_worker`` returns or
    raises, its last lines come before whatever the caller prints next (a
    Django command's ``CommandError`` came out before the worker's own
    "stopped" line).
    """
    if _installed is not None:
        _installed.flush_within(FLUSH_AT_EXIT)


def flush_writers(timeout: float) -> None:
    """Write what every writer of :func:`log_to_stderr` holds, for up to
    ``timeout`` seconds in all: before an ``os._exit``, which runs no
    ``atexit`` hook (a worker's last line, why it exits, was lost with it).
    """
    deadline = time.monotonic() + timeout
    for writer in list(_writers):
        writer.flush_within(max(deadline - time.monotonic(), 0.0))
