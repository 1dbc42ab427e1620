"""The dashboard's actions from a page that went stale: a job that moved on
since the page was drawn is not acted on as if it had not (both backends).
"""

from __future__ import annotations

import html
import re

from jobkeeper.models import Completion, Failure, JobStatus
from jobkeeper.outcomes import claim_of
from support.db import sql

from .conftest import _token


def test_a_stale_page_neither_reruns_a_completed_job_nor_hides_a_requeue(client, jq, seeded):
    # helper-77: a job page showed a retryable job's Retry button; the job then
    # ran again and completed; the Retry from that page ran it a third time.
    token = _token(client)
    page = client.get(f"/jobs/{seeded.retryable}").text
    assert 'name="seen" value="retryable"' in page
    # Meanwhile the job runs again and completes.
    jq.retry(seeded.retryable)
    (claimed,) = jq.backend.job_claim(worker_id=seeded.worker_id, queue="default", limit=1)
    assert claimed.id == seeded.retryable
    jq.backend.job_complete_many(completions=[Completion(claim_of(claimed), "1")], delete=False)
    before = jq.get_job(seeded.retryable)
    response = client.post(
        f"/jobs/{seeded.retryable}/retry", data={"csrf_token": token, "seen": "retryable"}
    )
    assert response.status_code == 409
    assert f"job {seeded.retryable} is completed now, not retryable" in html.unescape(response.text)
    assert jq.get_job(seeded.retryable) == before
    assert before.status == JobStatus.COMPLETED and before.attempt == 1
    # helper-79: a page showing it completed, then it ran and completed again.
    page = client.get(f"/jobs/{seeded.retryable}").text
    fence = re.search(r'name="seen_fence" value="(\d+)"', page)
    assert fence is not None and int(fence.group(1)) == before.fence
    form = {"csrf_token": token, "seen": "completed", "seen_fence": fence.group(1)}
    jq.retry(seeded.retryable)
    (claimed,) = jq.backend.job_claim(worker_id=seeded.worker_id, queue="default", limit=1)
    jq.backend.job_complete_many(completions=[Completion(claim_of(claimed), "2")], delete=False)
    again = jq.get_job(seeded.retryable)
    response = client.post(f"/jobs/{seeded.retryable}/retry", data=form)
    assert response.status_code == 409
    assert "it ran again since" in html.unescape(response.text)
    assert jq.get_job(seeded.retryable) == again

    # helper-80: through the dead letters and back. The fence goes on from
    # the dead letter's (schema version 18), so it tells on its own; a
    # requeue by an older release started it again at 0, back to the page's,
    # and the count of errors tells.
    def run(queue: str, outcome: str) -> None:
        (claimed,) = jq.backend.job_claim(worker_id=seeded.worker_id, queue=queue, limit=1)
        if outcome == "completed":
            jq.backend.job_complete_many(
                completions=[Completion(claim_of(claimed), "1")], delete=False
            )
        else:
            failure = Failure(claim_of(claimed), "dead", '{"attempt": 1, "error": "x"}')
            jq.backend.job_fail_many(failures=[failure])

    for older_release in (False, True):
        queue = "aba-old" if older_release else "aba"
        job = jq.enqueue("aba", {}, queue=queue, max_attempts=1)
        run(queue, "completed")
        page = client.get(f"/jobs/{job.id}").text
        form = {"csrf_token": token, **dict(re.findall(r'name="(seen\w*)" value="([^"]*)"', page))}
        assert set(form) == {"csrf_token", "seen", "seen_fence", "seen_errors"}
        jq.retry(job.id)
        run(queue, "dead")
        assert jq.requeue_dead([job.id]) == [job.id]
        if older_release:
            sql(jq, "UPDATE jobkeeper_jobs SET fence = 0 WHERE id = ?", [job.id])
        run(queue, "completed")
        again = jq.get_job(job.id)
        assert again.fence == (1 if older_release else 3) and form["seen_fence"] == "1"
        response = client.post(f"/jobs/{job.id}/retry", data=form)
        assert response.status_code == 409 and "it ran again since" in html.unescape(response.text)
        assert jq.get_job(job.id) == again
    # A forged fence that is no whole number: refused, not ignored.
    for forged in ("\u00b2", " 2", "-1", "0x2"):
        response = client.post(f"/jobs/{job.id}/retry", data={**form, "seen_fence": forged})
        assert response.status_code == 400, forged
    assert jq.get_job(job.id) == again

    # A dead letter requeued in another tab: its Requeue and Delete say where it went.
    assert jq.requeue_dead([seeded.dead]) == [seeded.dead]
    for action in ("requeue", "delete"):
        response = client.post(f"/dead/{seeded.dead}/{action}", data={"csrf_token": token})
        assert response.status_code == 409, action
        assert f"Job {seeded.dead} is no longer a dead letter: it is available now" in (
            html.unescape(response.text)
        )
    assert jq.get_job(seeded.dead).status == JobStatus.AVAILABLE
