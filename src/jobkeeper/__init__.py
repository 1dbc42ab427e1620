"""jobkeeper: a durable background job queue on PostgreSQL or SQLite.

Jobs are rows; workers claim them with ``SELECT ... FOR UPDATE SKIP LOCKED``
(PostgreSQL) or inside one ``BEGIN IMMEDIATE`` transaction (SQLite); failures
back off exponentially and end in a dead-letter table; heartbeats let live
workers rescue the jobs of dead ones.

    from jobkeeper import JobQueue

    jq = JobQueue()          # sqlite:///jobkeeper.db, or JobQueue("postgresql://...")
    jq.migrate()

    @jq.task(max_attempts=5)
    def send_email(to: str) -> None: ...

    send_email.enqueue(to="a@example.com")
    jq.run_worker()          # logs to stderr, unless the process set up logging
"""

from jobkeeper.api import JobQueue
from jobkeeper.context import complete_in, current_job
from jobkeeper.errors import (
    ClaimLost,
    ConfigError,
    DatabaseError,
    DatabaseRefused,
    DatabaseUnavailable,
    DataRejected,
    Discard,
    JobCancelled,
    JobFailed,
    JobkeeperError,
    JobNotFound,
    JobStateError,
    JobTimeout,
    PayloadError,
    QueueFull,
    Retry,
    Snooze,
)
from jobkeeper.events import EventKind, JobEvent, OutcomeKind
from jobkeeper.models import Job, JobStatus, RunningJob
from jobkeeper.queues import QueueInfo
from jobkeeper.schedule import Schedule
from jobkeeper.tasks import Task, TaskOptions
from jobkeeper.version import __version__

__all__ = [
    "ClaimLost",
    "ConfigError",
    "DataRejected",
    "DatabaseError",
    "DatabaseRefused",
    "DatabaseUnavailable",
    "Discard",
    "EventKind",
    "Job",
    "JobCancelled",
    "JobEvent",
    "JobFailed",
    "JobNotFound",
    "JobQueue",
    "JobStateError",
    "JobStatus",
    "JobTimeout",
    "JobkeeperError",
    "OutcomeKind",
    "PayloadError",
    "QueueFull",
    "QueueInfo",
    "Retry",
    "RunningJob",
    "Schedule",
    "Snooze",
    "Task",
    "TaskOptions",
    "__version__",
    "complete_in",
    "current_job",
]
