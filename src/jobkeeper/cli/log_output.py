"""Where ``jobkeeper worker`` writes its log: stderr, through a thread of its
own, so that a stream that stops taking lines never stops the worker.

A worker that logs straight to stderr blocks inside the write once the pipe
behind it is full (a log shipper, journald or docker that stopped reading).
Every thread that logs then blocks: runner threads reporting their jobs'
ends, so outcomes are never written, while the heartbeat thread, which logs
nothing, keeps the held jobs from being rescued; and the SIGTERM handler's
own line, so the worker cannot even stop. Here a logging call only queues the
record (``queue.SimpleQueue``, safe in a signal handler), a writer thread
writes it, and past :data:`MAX_QUEUED` waiting records new ones are dropped
and counted; the writer says how many once the stream takes lines again.
This is the "non-blocking handler" pattern of Python's logging cookbook
(``QueueHandler`` and a listener thread), with a bound.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import logging
import queue
import sys
import threading
from logging.handlers import QueueHandler
from typing import TextIO

from jobkeeper.context import bound_job

#: Records waiting for the writer past which new ones are dropped (about
#: 10 MB of log lines: enough to ride out a stall of the reader, bounded
#: when it never returns).
MAX_QUEUED = 10_000
#: Seconds the writer gets at exit to write what is queued (a stream that
#: takes nothing must not keep the process from exiting).
FLUSH_AT_EXIT = 2.0


class JobFields(logging.Filter):
    """Adds the running job's ``job_id``, ``task``, ``queue`` and ``attempt``
    to what a task's own code logs, as the worker's lines about the job carry
    them (the JSON format writes them as fields). Runs on the thread that
    logs, where :func:`jobkeeper.current_job` knows the job.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        if "job_id" not in fields:
            job = bound_job()
            if job is not None:
                fields.update(job_id=job.id, task=job.task, queue=job.queue, attempt=job.attempt)
        return True


class DroppingQueueHandler(QueueHandler):
    """Queues records for :class:`StreamWriter`; never blocks (see the module)."""

    def __init__(self, records: queue.SimpleQueue[logging.LogRecord | None]) -> None:
        super().__init__(records)
        self._records = records
        self._dropped = 0
        self._dropped_lock = threading.Lock()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # The message and traceback become text here, on the thread that
        # logs (the objects they name may change once it goes on); the
        # writer's formatter puts the line together.
        prepared = copy.copy(record)
        prepared.msg = record.getMessage()
        prepared.args = None
        if record.exc_info:
            prepared.exc_text = record.exc_text or logging.Formatter().formatException(
                record.exc_info
            )
            prepared.exc_info = None
        return prepared

    def enqueue(self, record: logging.LogRecord) -> None:
        if self._records.qsize() < MAX_QUEUED:
            self._records.put_nowait(record)
            return
        # A count missed under contention is better than a logging call that
        # waits on a lock (a signal handler's might wait on its own thread).
        if self._dropped_lock.acquire(blocking=False):
            self._dropped += 1
            self._dropped_lock.release()

    def take_dropped(self) -> int:
        """Records dropped since the last call."""
        with self._dropped_lock:
            dropped, self._dropped = self._dropped, 0
        return dropped


class StreamWriter:
    """Writes the queued records to ``stream`` with ``formatter``, first
    saying how many were dropped since the last record written.

    It writes itself rather than through a ``logging.StreamHandler``:
    ``logging.shutdown`` flushes every handler at exit under the handler's
    lock, which a write stuck on a full pipe holds, and the process would
    never exit.
    """

    def __init__(
        self,
        records: queue.SimpleQueue[logging.LogRecord | None],
        source: DroppingQueueHandler,
        stream: TextIO,
        formatter: logging.Formatter,
    ) -> None:
        self._records = records
        self._source = source
        self._stream = stream
        self._formatter = formatter
        self._writing: threading.Thread | None = None

    def handle(self, record: logging.LogRecord) -> None:
        """Write ``record`` (after the count of records dropped, if any)."""
        dropped = self._source.take_dropped()
        if dropped:
            self._write(
                logging.makeLogRecord(
                    {
                        "name": "jobkeeper.worker",
                        "levelno": logging.WARNING,
                        "levelname": "WARNING",
                        "msg": f"{dropped} log lines dropped: stderr did not take them "
                        f"(more than {MAX_QUEUED} were waiting)",
                    }
                )
            )
        self._write(record)

    def _write(self, record: logging.LogRecord) -> None:
        # A stream a task closed, or a formatter that fails on one record,
        # costs that line, never the writer thread.
        with contextlib.suppress(Exception):
            self._stream.write(self._formatter.format(record) + "\n")
            self._stream.flush()

    def start(self) -> None:
        """Start the writer thread."""
        self._writing = threading.Thread(target=self._run, name="jobkeeper-log-writer", daemon=True)
        self._writing.start()

    def _run(self) -> None:
        while (record := self._records.get()) is not None:
            self.handle(record)

    def stop_within(self, timeout: float) -> None:
        """Write what is queued, for up to ``timeout`` seconds, then stop."""
        writing, self._writing = self._writing, None
        if writing is None:
            return
        self._records.put_nowait(None)
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
    records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
    handler = DroppingQueueHandler(records)
    handler.addFilter(JobFields())
    writer = StreamWriter(records, handler, sys.stderr if stream is None else stream, formatter)
    writer.start()
    atexit.register(writer.stop_within, FLUSH_AT_EXIT)
    logging.basicConfig(level=level, handlers=[handler])
    return writer
