"""The soak's requeuer: takes dead letters back during the fault phase, by
every public way in turn, so that the checker can hold what a requeue
promises (fences that go on growing, nothing lost out of the dead letters)
under the same faults as everything else.

The ways: ``JobQueue.requeue_dead(ids)``, ``JobQueue.retry(id,
if_status="dead")``, and the CLI in a subprocess: ``jobkeeper dead requeue
ID...`` and ``jobkeeper retry ID``. (``retry --status dead`` is not used: it
takes every dead letter and names none, so neither the share nor what moved
could be told.) Only what a call confirms is recorded as requeued; a call
whose outcome is unknown (``DatabaseUnavailable``, which may hide a commit
whose reply was lost; a CLI run that failed so or timed out) records its
jobs as maybe requeued, and the checker accepts either.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from benchmarks.soak.records import LOGGED, Expected, Requeue
from jobkeeper import DatabaseError, DatabaseUnavailable, JobQueue
from jobkeeper.errors import JobNotFound, JobStateError

WAYS = ("api_requeue_dead", "api_retry", "cli_dead_requeue", "cli_retry")
#: Kinds taken back: those that log their executions. Poison jobs stay dead:
#: the crash budget's check counts the workers they kill.
REQUEUED_KINDS = LOGGED - {"long"}
#: Seconds a CLI run may take (its pool waits out an outage first).
CLI_TIMEOUT = 60.0


class Requeuer:
    """Every ``every`` seconds, takes up to ``batch`` dead letters back, each
    at most ``max_per_job`` times (maybe-requeues included), by the next way
    in :data:`WAYS`.

    Attributes:
        requeues: what was requeued, confirmed or maybe (see :class:`Requeue`).
        errors: calls that failed with anything but ``DatabaseUnavailable``
            or a refusal (the job was no longer dead): a failure of the run.
    """

    def __init__(
        self,
        jq: JobQueue,
        url: str,
        rng: random.Random,
        enqueued: Mapping[int, Expected],
        *,
        every: float = 2.0,
        batch: int = 8,
        max_per_job: int = 2,
    ) -> None:
        self.jq = jq
        self.url = url
        self.rng = rng
        self.enqueued = enqueued
        self.every = every
        self.batch = batch
        self.max_per_job = max_per_job
        self.requeues: list[Requeue] = []
        self.errors: list[str] = []
        self.calls: Counter[str] = Counter()
        self.tried: Counter[str] = Counter()  # jobs, per way
        self._taken: Counter[int] = Counter()
        self._turn = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.every * self.rng.uniform(0.5, 1.5)):
            self.round()

    def round(self) -> None:
        """One requeue by the next way; a database that is down skips it."""
        try:
            dead = self.jq.list_jobs(status="dead", limit=1000)
        except DatabaseError:
            return  # down: the next round tries again
        candidates = [
            job.id
            for job in dead
            if self._taken[job.id] < self.max_per_job
            and (expected := self.enqueued.get(job.id)) is not None
            and expected.kind in REQUEUED_KINDS
        ]
        if not candidates:
            return
        way = WAYS[self._turn % len(WAYS)]
        self._turn += 1
        ids = sorted(self.rng.sample(candidates, min(self.batch, len(candidates))))
        if way == "cli_retry":
            ids = ids[:2]  # one process per job
        for job_id in ids:
            self._taken[job_id] += 1
        self.calls[way] += 1
        self.tried[way] += len(ids)
        act: dict[str, Callable[[list[int]], tuple[list[int], list[int]]]] = {
            "api_requeue_dead": self._api_requeue_dead,
            "api_retry": self._api_retry,
            "cli_dead_requeue": self._cli_dead_requeue,
            "cli_retry": self._cli_retry,
        }
        began = time.time()
        moved, maybe = act[way](ids)
        ended = time.time()
        self.requeues += [Requeue(i, way, began, ended) for i in moved]
        self.requeues += [Requeue(i, way, began, ended, confirmed=False) for i in maybe]

    # Each way returns (ids confirmed moved, ids maybe moved).

    def _api_requeue_dead(self, ids: list[int]) -> tuple[list[int], list[int]]:
        try:
            return self.jq.requeue_dead(ids), []
        except DatabaseUnavailable:
            return [], ids
        except DatabaseError as exc:
            self.errors.append(f"requeue_dead raised {type(exc).__name__}: {exc}")
            return [], ids

    def _api_retry(self, ids: list[int]) -> tuple[list[int], list[int]]:
        moved, maybe = [], []
        for job_id in ids:
            try:
                self.jq.retry(job_id, if_status="dead")
                moved.append(job_id)
            except (JobNotFound, JobStateError):
                pass  # no longer a dead letter: nothing moved
            except DatabaseUnavailable:
                maybe.append(job_id)
            except DatabaseError as exc:
                self.errors.append(f"retry raised {type(exc).__name__}: {exc}")
                maybe.append(job_id)
        return moved, maybe

    def _cli(self, *args: str) -> tuple[int | None, str, str]:
        command = [sys.executable, "-m", "jobkeeper", "--database", self.url, *args]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            return None, "", "timed out"
        return done.returncode, done.stdout, done.stderr

    def _cli_unclear(self, what: str, code: int | None, err: str) -> bool:
        """Whether a failed CLI run is an outage (else it is recorded as an error)."""
        if code is None or "unavailable" in err.lower():
            return True
        self.errors.append(f"{what} exited {code}: {err.strip()[:300]}")
        return False

    def _cli_dead_requeue(self, ids: list[int]) -> tuple[list[int], list[int]]:
        code, out, err = self._cli("dead", "requeue", *map(str, ids))
        # "requeued N jobs: ID ID ..." (every id: at most 20 are passed),
        # then, exit 1, "error: not dead letters: ..." for the others.
        moved = []
        for line in out.splitlines():
            if line.startswith("requeued ") and ":" in line:
                moved = [int(word) for word in line.split(":", 1)[1].split()]
        if code == 0 or (code == 1 and "not dead letters" in err):
            return moved, []
        self._cli_unclear("jobkeeper dead requeue", code, err)
        return [], ids

    def _cli_retry(self, ids: list[int]) -> tuple[list[int], list[int]]:
        moved, maybe = [], []
        for job_id in ids:
            code, out, err = self._cli("retry", str(job_id))
            if code == 0 and out.startswith(f"job {job_id} is "):
                moved.append(job_id)
            elif code == 1 and ("only dead" in err or "changed" in err or "no job" in err):
                pass  # no longer a dead letter
            else:
                self._cli_unclear("jobkeeper retry", code, err)
                maybe.append(job_id)
        return moved, maybe

    def stats(self) -> dict[str, dict[str, int]]:
        """Per way: ``calls``, the ``jobs`` they named, of which ``confirmed``
        and ``maybe`` requeued (the rest were no longer dead letters).
        """
        out = {
            way: {"calls": self.calls[way], "jobs": self.tried[way], "confirmed": 0, "maybe": 0}
            for way in WAYS
        }
        for requeue in self.requeues:
            out[requeue.way]["confirmed" if requeue.confirmed else "maybe"] += 1
        return out
