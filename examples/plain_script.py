"""The smallest jobkeeper program: define tasks, enqueue, run a worker.

    python examples/plain_script.py                          # SQLite: ./plain-example.db
    EXAMPLE_DATABASE_URL=postgresql://user@host/db python examples/plain_script.py

In production the worker runs as its own process (``jobkeeper worker --app
module:jq``); here it runs in burst mode: it works until nothing is left.
"""

from __future__ import annotations

import os

from jobkeeper import JobQueue, Retry, current_job

jq = JobQueue(os.environ.get("EXAMPLE_DATABASE_URL", "sqlite:///plain-example.db"))


@jq.task(max_attempts=3)
def resize(path: str, width: int) -> dict[str, object]:
    return {"path": path, "width": width}


@jq.task()
def flaky(name: str) -> str:
    job = current_job()
    if job.attempt < 2:
        raise Retry(delay=0)  # ask for another attempt at once
    return f"{name} worked on attempt {job.attempt}"


def main() -> None:
    jq.migrate()
    jobs = [resize.enqueue(path="a.png", width=100), flaky.enqueue(name="flaky")]
    jq.run_worker(burst=True, concurrency=2)
    for job in jobs:
        done = jq.get_job(job.id)
        assert done is not None
        print(f"job {done.id} {done.task}: {done.status} -> {done.result}")
    jq.close()


if __name__ == "__main__":
    main()
