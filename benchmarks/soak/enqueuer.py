"""The soak's producer: the chaos mix of jobs, enqueued at a steady rate through faults."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from benchmarks.soak.faults import Faults
from benchmarks.soak.history import Expected
from jobkeeper import DatabaseError, DatabaseUnavailable, JobQueue


class Enqueuer:
    """Enqueues the chaos mix at a steady rate, through faults."""

    def __init__(
        self,
        jq: JobQueue,
        rng: random.Random,
        faults: Faults | None,
        serial: tuple[float, int] | None = None,
    ) -> None:
        self.jq = jq
        self.rng = rng
        self.faults = faults
        #: (share of the default queue's jobs, number of keys) or None.
        self.serial = serial
        self.enqueued: dict[int, Expected] = {}
        self.ambiguous: dict[int, str] = {}
        self.refused = 0
        self.errors: list[str] = []
        self.refusal_messages: list[str] = []
        self._token = 0

    def token(self) -> int:
        self._token += 1
        return self._token

    def job(self) -> tuple[str, dict[str, Any], dict[str, Any], str]:
        r = self.rng.random
        n = self.token()
        duration = r()
        if duration < 0.6:
            ms = r() * 5
        elif duration < 0.85:
            ms = 5 + r() * 45
        elif duration < 0.98:
            ms = 50 + r() * 250
        else:
            ms = 1000 + r() * 2000
        mode = r()
        options: dict[str, Any] = {"queue": "bulk" if r() < 0.2 else "default"}
        if r() < 0.1:
            options["priority"] = self.rng.randint(-5, 5)
        if self.serial is not None and options["queue"] == "default" and r() < self.serial[0]:
            options["serial_key"] = f"user:{self.rng.randrange(self.serial[1])}"
        args: dict[str, Any] = {"n": n, "ms": round(ms, 3)}
        if mode < 0.78:
            kind = "ok"
        elif mode < 0.88:
            kind, args["mode"], args["fails"] = "flaky", "flaky", self.rng.randint(1, 2)
        elif mode < 0.93:
            kind, args["mode"], args["fails"] = "retry", "retry", self.rng.randint(1, 2)
        elif mode < 0.98:
            kind, args["mode"] = "fail", "fail"
            options["max_attempts"] = 3
        else:
            kind, args["mode"] = "discard", "discard"
        task = "soak.work"
        if r() < 0.15:
            task = "soak.work_async"
        elif r() < 0.04:
            args["cpu"] = True
            args["ms"] = min(args["ms"], 50.0)
        return task, args, options, kind

    def enqueue_batch(self, count: int) -> None:
        batch = [self.job() for _ in range(count)]
        try:
            if len(batch) == 1:
                task, args, options, _ = batch[0]
                jobs = [self.jq.enqueue(task, args, **options)]
            else:
                jobs = self.jq.enqueue_many([(t, a, o) for t, a, o, _ in batch])
        except DatabaseUnavailable as exc:
            # A commit whose reply was lost may still have happened: these
            # tokens may exist (once), or not.
            self.refused += 1
            self.refusal_messages.append(str(exc))
            for _, args, _, kind in batch:
                self.ambiguous[args["n"]] = kind
            return
        except DatabaseError as exc:
            self.errors.append(f"enqueue raised {type(exc).__name__}: {exc}")
            for _, args, _, kind in batch:
                self.ambiguous[args["n"]] = kind
            return
        for job, (_, args, _, kind) in zip(jobs, batch, strict=True):
            self.enqueued[job.id] = Expected(args["n"], kind)

    def run(self, total: int, seconds: float, stop: threading.Event) -> None:
        started = time.monotonic()
        done = 0
        while done < total and not stop.is_set():
            due = min(total, int(total * (time.monotonic() - started) / seconds) + 1)
            while done < due and not stop.is_set():
                size = min(due - done, self.rng.choice((1, 1, 5, 20, 50)))
                if self.rng.random() < 0.01:
                    # Now and then a batch past COPY_MIN_JOBS, ahead of the
                    # schedule: PostgreSQL copies it in while validating it,
                    # the path whose transaction faults must not split.
                    size = min(total - done, 100)
                self.enqueue_batch(size)
                done += size
            stop.wait(0.05)

    def poison(self, count: int) -> None:
        """Jobs that kill their worker at every attempt (the crash budget)."""
        for _ in range(count):
            n = self.token()
            job = self.jq.enqueue("soak.poison", {"n": n})
            self.enqueued[job.id] = Expected(n, "poison")

    def special(self) -> None:
        """Jobs left pending on purpose, and pending jobs cancelled."""
        for kind in ("pending", "cancel"):
            for _ in range(10):
                n = self.token()
                job = self.jq.enqueue("soak.work", {"n": n, "ms": 1}, delay=86_400)
                self.enqueued[job.id] = Expected(n, kind)
                if kind == "cancel":
                    self.jq.cancel(job.id)
