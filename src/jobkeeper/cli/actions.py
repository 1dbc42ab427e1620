"""``jobkeeper retry`` and ``cancel``: one job by id, or every job a filter
selects (``--status``, ``--queue``, ``--task``) after saying how many and
asking (``--yes`` skips the question).

A filtered action lists the matching ids first, then acts on each as
``retry ID`` / ``cancel ID`` would, a thousand jobs per statement (a retry
only of jobs still in a status the filter selects): a job that changed
state in between is skipped and counted, never an error; so is a job whose
retry the unique_key of a pending job refuses.
Each keyset page of ids is one statement over every selected status and
the dead letters (one snapshot): read a status at a time, a job that moved
between two reads was acted on twice, or not at all.
These are operator actions: no queue limit (``max_pending``) refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import click

from jobkeeper.api import JobQueue
from jobkeeper.cli.common import (
    IDS_MAY_LOOK_LIKE_OPTIONS,
    JOB_ID,
    Argument,
    BadInput,
    Command,
    confirm,
    console,
    open_queue,
    yes_option,
)
from jobkeeper.config import check_name
from jobkeeper.errors import JobNotFound, JobStateError, UniqueKeyConflict
from jobkeeper.models import HELD_STATUSES, JobStatus, requeue_clashes

#: What a filtered retry selects without --status; completed jobs only when
#: asked (running a finished job again is rarely what a filter means).
RETRY_DEFAULT = (JobStatus.DEAD, JobStatus.RETRYABLE, JobStatus.CANCELLED)
RETRY_FROM = (*RETRY_DEFAULT, JobStatus.COMPLETED)
#: Every status a cancel applies to (held jobs: their worker is asked to stop).
CANCEL_FROM = (
    JobStatus.SCHEDULED,
    JobStatus.AVAILABLE,
    JobStatus.CLAIMED,
    JobStatus.RUNNING,
    JobStatus.RETRYABLE,
)
#: Ids read per page while collecting a filter's jobs.
PAGE = 10_000
#: Jobs a filtered action moves per statement: dead letters a retry moves
#: back, other jobs it retries, jobs a cancel cancels (or flags for their
#: workers).
BATCH = 1_000
#: Statements a batch of dead letters gets, each after leaving out those
#: whose unique_key a pending job took, before it goes one by one.
DEAD_TRIES = 3
#: Statements a batch of other jobs gets to retry, each refused because a
#: pending job took a key while it ran, before it goes one by one.
LIVE_TRIES = 3

_optional_job_id = click.argument(
    "job_id",
    cls=Argument,
    type=JOB_ID,
    required=False,
    doc="The job id (or select jobs with --status, --queue and --task).",
)


def _filter_options(
    statuses: Iterable[JobStatus],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    names = ", ".join(s.value for s in statuses)

    def decorate(function: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(
            (
                click.option(
                    "--status", default=None, help=f"Select jobs in this status: {names}."
                ),
                click.option("--queue", default=None, help="Select jobs of this queue."),
                click.option("--task", default=None, help="Select jobs of this task."),
                yes_option,
            )
        ):
            function = option(function)
        return function

    return decorate


def _selected(
    action: str,
    allowed: tuple[JobStatus, ...],
    default: tuple[JobStatus, ...],
    status: str | None,
) -> tuple[JobStatus, ...]:
    if status is None:
        return default
    try:
        chosen = JobStatus(status)
    except ValueError:
        chosen = None
    if chosen not in allowed:
        valid = ", ".join(s.value for s in allowed)
        raise BadInput(f"{action} --status {status!r}: use one of {valid}")
    return (chosen,)


def _matching_ids(
    jq: JobQueue, statuses: tuple[JobStatus, ...], queue: str | None, task: str | None
) -> dict[JobStatus, list[int]]:
    """Every id of the filter by the status it was read in (in the order of
    ``statuses``), newest first. Each id once: the keyset pages are disjoint
    ranges of ids, each read in one statement over every status.
    """
    for name, value in (("queue", queue), ("task", task)):
        if value is not None:
            check_name(name, value)
    read: dict[JobStatus, list[int]] = {}
    before: int | None = None
    while True:
        page = jq.backend.job_list_ids(
            statuses=[status.value for status in statuses],
            queue=queue,
            task=task,
            before=before,
            limit=PAGE,
        )
        for job_id, status in page:
            read.setdefault(status, []).append(job_id)
        if len(page) < PAGE:
            break
        before = page[-1][0]
    return {status: read[status] for status in statuses if status in read}


def _describe(statuses: tuple[JobStatus, ...], queue: str | None, task: str | None) -> str:
    parts = ["status " + "/".join(s.value for s in statuses)]
    if queue is not None:
        parts.append(f"queue {queue}")
    if task is not None:
        parts.append(f"task {task}")
    return ", ".join(parts)


def _plural(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


class _Tally:
    """What a filtered action did so far (told in full when interrupted)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.acted = self.asked = self.skipped = 0
        #: Jobs of the step under way (its statement may have committed
        #: when Ctrl-C lands before it is counted).
        self.step = 0

    def line(self, done: str) -> str:
        line = f"{done} {_plural(self.acted)}"
        if self.step:
            line += f" (and perhaps up to {self.step} more: the step under way)"
        if self.asked:
            line += f"; asked the workers of {_plural(self.asked)} to stop them"
        if self.skipped:
            line += (
                f"; skipped {self.skipped} that changed state meanwhile (or whose "
                "unique_key a pending job holds)"
            )
        return line


def _by_filter(
    ctx: click.Context,
    *,
    action: str,
    done: str,
    statuses: tuple[JobStatus, ...],
    queue: str | None,
    task: str | None,
    yes: bool,
    act: Callable[[JobQueue, int], bool],
    act_dead: Callable[[JobQueue, list[int]], list[int]] | None = None,
    act_live: Callable[[JobQueue, list[int]], dict[int, bool]] | None = None,
) -> None:
    """Count the filter's jobs, ask, then ``act`` on each id (True: a job
    whose worker was only asked, counted apart); jobs that changed state
    meanwhile are skipped and counted. ``act_dead``: acts on a batch of
    dead letters at once, returning the ids it moved (one statement per
    batch where ``act`` takes two round trips per job); ``act_live`` on a
    batch of other jobs, returning those it acted on, each True when its
    worker was only asked (UniqueKeyConflict: it acted on none). Jobs of a
    batch ``act_live`` left alone that may be dead letters by now (with
    ``act_dead`` and dead letters selected) go to ``act_dead`` next, as
    ``act`` would have found them. Ctrl-C stops it saying how far it got.
    """
    jq = open_queue(ctx)
    description = _describe(statuses, queue, task)
    found = _matching_ids(jq, statuses, queue, task)
    total = sum(len(ids) for ids in found.values())
    if not total:
        console.print(f"no jobs match ({description})", markup=False, highlight=False)
        return
    if not yes:
        confirm(f"{action} {_plural(total)} ({description})?", action)
    tally = _Tally(total)
    try:
        for status, ids in found.items():
            if status is JobStatus.DEAD and act_dead is not None:
                _dead_in_batches(jq, ids, act, act_dead, tally)
            elif status is not JobStatus.DEAD and act_live is not None:
                # One by one, a job listed here and dead by its turn was
                # moved back from the dead letters.
                died = act_dead if JobStatus.DEAD in statuses else None
                _live_in_batches(jq, ids, act, act_live, died, tally)
            else:
                _one_by_one(jq, ids, act, tally)
    except KeyboardInterrupt:
        seen = tally.acted + tally.asked + tally.skipped
        console.print(
            f"interrupted after {seen} of {_plural(total)}: {tally.line(done)}; the same "
            "command selects what is left",
            markup=False,
            highlight=False,
        )
        raise
    console.print(tally.line(done), markup=False, highlight=False)


def _one_by_one(
    jq: JobQueue, ids: list[int], act: Callable[[JobQueue, int], bool], tally: _Tally
) -> None:
    for job_id in ids:
        tally.step = 1
        try:
            if act(jq, job_id):
                tally.asked += 1
            else:
                tally.acted += 1
        except (JobNotFound, JobStateError):
            tally.skipped += 1
        tally.step = 0


def _live_in_batches(
    jq: JobQueue,
    ids: list[int],
    act: Callable[[JobQueue, int], bool],
    act_live: Callable[[JobQueue, list[int]], dict[int, bool]],
    act_dead: Callable[[JobQueue, list[int]], list[int]] | None,
    tally: _Tally,
) -> None:
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        tally.step = len(batch)
        for _ in range(LIVE_TRIES):
            try:
                after = act_live(jq, batch)
            except UniqueKeyConflict:
                # A pending job took a key the statement found free (a
                # concurrent enqueue): nothing was written; the next
                # statement sees that job and leaves the key's job out.
                continue
            asked = sum(after.values())
            tally.acted += len(after) - asked
            tally.asked += asked
            left = [job_id for job_id in batch if job_id not in after]
            if left and act_dead is not None:
                _dead_in_batches(jq, left, act, act_dead, tally)
            else:
                tally.skipped += len(left)
            break
        else:
            # Refused every time: keys keep being taken. One by one, each
            # clash skips one job.
            _one_by_one(jq, batch, act, tally)
        tally.step = 0


def _dead_in_batches(
    jq: JobQueue,
    ids: list[int],
    act: Callable[[JobQueue, int], bool],
    act_dead: Callable[[JobQueue, list[int]], list[int]],
    tally: _Tally,
) -> None:
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        for _ in range(DEAD_TRIES):
            tally.step = len(batch)
            try:
                moved = len(act_dead(jq, batch)) if batch else 0
            except JobStateError:
                # A unique_key in the way refuses the whole batch: leave out
                # the dead letters it concerns, try the rest again.
                clashing = _clashing(jq, batch)
                tally.skipped += len(clashing)
                batch = [job_id for job_id in batch if job_id not in clashing]
                continue
            tally.acted += moved
            tally.skipped += len(batch) - moved
            break
        else:
            # Refused every time: pending jobs keep taking the keys left
            # (concurrent enqueues). One by one, each clash skips one job.
            _one_by_one(jq, batch, act, tally)
        tally.step = 0


def _clashing(jq: JobQueue, batch: list[int]) -> set[int]:
    """The dead letters of ``batch`` whose requeue the unique index refuses
    now: a pending job holds their key, or one of the batch with a smaller
    id has it (one by one, that one would be requeued and these skipped).
    """
    conflicts = jq.backend.dead_letter_requeue_conflicts(job_ids=batch)
    return {conflict.dead_letter_id for conflict, _ in requeue_clashes(conflicts)}


def _one_or_filter(job_id: int | None, *filters: str | None) -> bool:
    """Whether a filter selects the jobs (else ``job_id`` names the one)."""
    given = any(value is not None for value in filters)
    if (job_id is None) == (not given):
        raise BadInput("give a job id, or select jobs with --status, --queue or --task (not both)")
    return given


@click.command("retry", cls=Command, context_settings=IDS_MAY_LOOK_LIKE_OPTIONS)
@_optional_job_id
@_filter_options(RETRY_FROM)
@click.pass_context
def retry(
    ctx: click.Context,
    job_id: int | None,
    status: str | None,
    queue: str | None,
    task: str | None,
    yes: bool,
) -> None:
    """Run a dead, retryable, cancelled or completed job again now; or the jobs a filter selects.

    Attempts are reset. A filter (--status, --queue, --task) selects dead,
    retryable and cancelled jobs unless --status says otherwise, says how
    many match and asks before acting (--yes: no question).
    """
    if not _one_or_filter(job_id, status, queue, task) and job_id is not None:
        job = open_queue(ctx).retry(job_id)
        console.print(f"job {job.id} is {job.status.value}", highlight=False)
        return

    chosen = _selected("retry", RETRY_FROM, RETRY_DEFAULT, status)

    def act(jq: JobQueue, one: int) -> bool:
        # Still selected: a job that ran and completed since is not run again.
        jq.retry(one, if_status=chosen)
        return False

    def act_dead(jq: JobQueue, ids: list[int]) -> list[int]:
        return jq.requeue_dead(ids)

    def act_live(jq: JobQueue, ids: list[int]) -> dict[int, bool]:
        # One statement per thousand jobs: one by one, two round trips a
        # job, 50,000 took 33 s.
        statuses = [status.value for status in chosen]
        return dict.fromkeys(jq.backend.job_retry_many(job_ids=ids, statuses=statuses), False)

    _by_filter(
        ctx,
        action="retry",
        done="retried",
        statuses=chosen,
        queue=queue,
        task=task,
        yes=yes,
        act=act,
        act_dead=act_dead,
        act_live=act_live,
    )


@click.command("cancel", cls=Command, context_settings=IDS_MAY_LOOK_LIKE_OPTIONS)
@_optional_job_id
@_filter_options(CANCEL_FROM)
@click.pass_context
def cancel(
    ctx: click.Context,
    job_id: int | None,
    status: str | None,
    queue: str | None,
    task: str | None,
    yes: bool,
) -> None:
    """Cancel a pending job, or ask the worker running it to stop; or the jobs a filter selects.

    A filter (--status, --queue, --task) selects every unfinished job unless
    --status says otherwise, says how many match and asks before acting
    (--yes: no question).
    """
    if not _one_or_filter(job_id, status, queue, task) and job_id is not None:
        job = open_queue(ctx).cancel(job_id)
        held = job.status in HELD_STATUSES
        note = " (cancel requested; its worker will stop it)" if held else ""
        console.print(f"job {job.id} is {job.status.value}{note}", highlight=False)
        return

    def act(jq: JobQueue, one: int) -> bool:
        return jq.cancel(one).status in HELD_STATUSES

    def act_live(jq: JobQueue, ids: list[int]) -> dict[int, bool]:
        # One statement per thousand jobs: one by one, 50,000 took 35 s.
        after = jq.backend.job_cancel_many(job_ids=ids)
        return {job_id: status in HELD_STATUSES for job_id, status in after.items()}

    _by_filter(
        ctx,
        action="cancel",
        done="cancelled",
        statuses=_selected("cancel", CANCEL_FROM, CANCEL_FROM, status),
        queue=queue,
        task=task,
        yes=yes,
        act=act,
        act_live=act_live,
    )
