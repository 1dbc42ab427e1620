"""C-11: a naive datetime for run-at makes delayed jobs run at once, or hours
late (arq#184, django-rq#63).

The enqueuing process runs with ``TZ=Asia/Tokyo`` (UTC+9) and
``TZ=America/Los_Angeles``. A naive ``run_at`` is refused (every way in) with
an error asking for an aware datetime, and nothing is written. An aware time
in another zone 10 minutes ahead is stored as that instant (``jobs show``
prints it in UTC, in the far zone too) and is not run; one a few seconds
ahead is run by a real worker after its time and within the poll interval;
one in the past runs now. A negative CLI delay exits 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import pytest

from backends.helpers import total_rows
from cli.helpers import assert_one_line_error, run_module
from jobkeeper import JobQueue, JobStatus
from support.db import job
from support.waiting import wait_status
from worker.helpers import running

ZONES = ["Asia/Tokyo", "America/Los_Angeles"]

ENQUEUER = """
import json, sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo
from jobkeeper import ConfigError, JobQueue

# "t" is run by the test's own worker (another process): external to this queue.
jq = JobQueue(sys.argv[1], external_tasks=["t"])
here = datetime.now().astimezone().tzinfo        # the process's zone (TZ)
elsewhere = ZoneInfo("Australia/Adelaide")       # UTC+9:30/+10:30, neither UTC nor TZ
refused = []
naive = datetime.now() + timedelta(minutes=10)
for way, call in [
    ("enqueue", lambda: jq.enqueue("t", {}, run_at=naive)),
    ("enqueue_many", lambda: jq.enqueue_many(
        [("t", {"i": i}) for i in range(9)] + [("t", {}, {"run_at": naive})])),
    ("options", lambda: jq.task(lambda: None, name="t2").options(run_at=naive).enqueue()),
]:
    try:
        call()
        refused.append([way, None])
    except ConfigError as exc:
        refused.append([way, str(exc)])
soon = datetime.now(here) + timedelta(seconds=2)
later = datetime.now(elsewhere) + timedelta(minutes=10)
past = datetime.now(here) - timedelta(hours=3)
jobs = {
    "soon": jq.enqueue("t", {"when": "soon"}, run_at=soon),
    "later": jq.enqueue("t", {"when": "later"}, run_at=later),
    "past": jq.enqueue("t", {"when": "past"}, run_at=past),
}
print(json.dumps({
    "offset": datetime.now().astimezone().utcoffset().total_seconds(),
    "refused": refused,
    "ids": {k: j.id for k, j in jobs.items()},
    "at": {"soon": soon.isoformat(), "later": later.isoformat(), "past": past.isoformat()},
}))
"""


def enqueue_in_zone(url: str, tz: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", ENQUEUER, url],
        env={**os.environ, "TZ": tz},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("tz", ZONES)
def test_c11_naive_refused_aware_kept_past_now_from_a_far_zone(make_queue, tz):
    jq = make_queue()  # FAST: polls every 50 ms
    ran: dict[int, datetime] = {}

    @jq.task
    def t(**kwargs: Any) -> None:
        from jobkeeper import current_job

        ran[current_job().id] = jq.backend.db_now()

    report = enqueue_in_zone(jq.url.url, tz)
    assert report["offset"] != 0  # the child really ran far from UTC
    for way, error in report["refused"]:
        assert error is not None, f"{way}: a naive run_at was accepted"
        assert "naive datetime; pass an aware one" in error, (way, error)
    assert "jobs[9]: run_at=" in report["refused"][1][1]
    assert total_rows(jq) == 3  # only the three aware jobs
    ids = report["ids"]
    at = {name: datetime.fromisoformat(text) for name, text in report["at"].items()}
    for name, job_id in ids.items():
        assert job(jq, job_id).scheduled_at == at[name], name
        assert job(jq, job_id).scheduled_at.utcoffset() == timedelta(0)
    assert job(jq, ids["past"]).status == JobStatus.AVAILABLE
    assert job(jq, ids["later"]).status == JobStatus.SCHEDULED
    with running(jq.worker(concurrency=2)):
        wait_status(jq, [ids["past"], ids["soon"]], {JobStatus.COMPLETED}, timeout=30)
    # Not before its time, and not hours late: within a poll (and a loaded
    # machine's slack) after it.
    assert at["soon"] <= ran[ids["soon"]] < at["soon"] + timedelta(seconds=10)
    assert ids["later"] not in ran
    later = job(jq, ids["later"])
    assert later.status == JobStatus.SCHEDULED
    # jobs show, run in the same far zone, prints the instant in UTC.
    shown = run_module("--database", jq.url.url, "jobs", "show", str(later.id), env={"TZ": tz})
    assert shown.returncode == 0, shown.stderr
    assert later.scheduled_at.isoformat().endswith("+00:00")
    assert later.scheduled_at.isoformat() in shown.stdout


@pytest.mark.parametrize("tz", ZONES)
def test_c11_cli_negative_delay_exits_2(db_url, tz):
    with JobQueue(db_url) as jq:
        jq.migrate()
        bad = run_module("--database", db_url, "enqueue", "t", "--delay", "-600", env={"TZ": tz})
        assert bad.returncode == 2, bad.stderr
        assert_one_line_error(bad.stderr, "delay")
        assert total_rows(jq) == 0
