"""Click through the dashboard in Chromium: overview -> queue -> job -> retry,
on both backends, and keep a screenshot of each page.
"""

from __future__ import annotations

import re

from dashboard.seed import seed
from jobkeeper.dashboard import create_app
from jobkeeper.models import JobStatus


def _name(jq) -> str:
    return jq.backend.name


def test_overview_queue_job_retry(jq, browser, serve, artifacts):
    seeded = seed(jq)
    base = serve(create_app(jq))
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(base + "/")
        assert page.title() == "Overview · jobkeeper"
        assert page.locator("table.grid").count() == 1
        page.screenshot(path=str(artifacts / f"{_name(jq)}-1-overview.png"), full_page=True)

        # Overview -> the queue of the retrying job.
        page.get_by_role("link", name="default", exact=True).click()
        page.wait_for_url(re.compile(r"/jobs\?queue=default$"))
        assert "Queue default" in page.locator("h1").inner_text()
        page.screenshot(path=str(artifacts / f"{_name(jq)}-2-queue.png"), full_page=True)

        # Queue -> the job.
        page.get_by_role("link", name=str(seeded.retryable), exact=True).click()
        page.wait_for_url(re.compile(rf"/jobs/{seeded.retryable}$"))
        assert "connection refused" in page.locator(".error-entry").first.inner_text()
        page.screenshot(path=str(artifacts / f"{_name(jq)}-3-job.png"), full_page=True)

        # Job -> retry (a POST with the CSRF token), back on the job's page.
        page.get_by_role("button", name="Retry").click()
        page.wait_for_load_state()
        assert "is available again" in page.locator(".flash").inner_text()
        page.screenshot(path=str(artifacts / f"{_name(jq)}-4-retried.png"), full_page=True)
        job = jq.get_job(seeded.retryable)
        assert job is not None and job.status == JobStatus.AVAILABLE and job.attempt == 0

        for path, name in (("/dead", "5-dead"), ("/workers", "6-workers"),
                           (f"/jobs/{seeded.dead}", "7-dead-job")):  # fmt: skip
            page.goto(base + path)
            page.screenshot(path=str(artifacts / f"{_name(jq)}-{name}.png"), full_page=True)
    finally:
        page.close()


def test_dead_letter_requeue_in_browser(jq, browser, serve):
    seeded = seed(jq)
    base = serve(create_app(jq))
    page = browser.new_page()
    try:
        page.goto(f"{base}/dead")
        page.get_by_role("link", name=str(seeded.dead), exact=True).click()
        page.get_by_role("button", name="Requeue").click()
        page.wait_for_load_state()
        assert "requeued" in page.locator(".flash").inner_text()
        assert jq.get_job(seeded.dead).status == JobStatus.AVAILABLE
    finally:
        page.close()


def test_read_only_shows_no_buttons(jq, browser, serve):
    seeded = seed(jq)
    base = serve(create_app(jq, read_only=True))
    page = browser.new_page()
    try:
        page.goto(f"{base}/jobs/{seeded.retryable}")
        assert page.get_by_role("button").count() == 0
        assert "read-only" in page.locator(".topbar").inner_text()
    finally:
        page.close()


def test_pause_and_resume_a_queue_in_browser(jq, browser, serve, artifacts):
    seed(jq)
    jq.configure_queue("emails", concurrency=5, rate_limit="100/m")
    jq.periodic("0 3 * * *", task="nightly_report", queue="reports")
    from jobkeeper.maintenance.periodic import PeriodicEnqueuer

    PeriodicEnqueuer(jq.backend, list(jq.periodics.values())).run_once()
    base = serve(create_app(jq))
    page = browser.new_page(viewport={"width": 1280, "height": 700})
    # The pause button asks first (a confirm dialog): accept it.
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        page.goto(base + "/")
        page.get_by_role("link", name="Queues", exact=True).click()
        page.wait_for_url(re.compile(r"/queues$"))
        row = page.locator("tr", has=page.get_by_role("link", name="emails", exact=True))
        row.get_by_role("button", name="Pause").click()
        page.wait_for_load_state()
        assert "paused" in page.locator(".flash").inner_text()
        assert {q.name: q.paused for q in jq.queues()}["emails"] is True
        page.screenshot(path=str(artifacts / f"{_name(jq)}-8-queues.png"), full_page=True)
        row = page.locator("tr", has=page.get_by_role("link", name="emails", exact=True))
        row.get_by_role("button", name="Resume").click()
        page.wait_for_load_state()
        assert {q.name: q.paused for q in jq.queues()}["emails"] is False

        page.get_by_role("link", name="Periodic", exact=True).click()
        page.wait_for_url(re.compile(r"/periodic$"))
        assert "0 3 * * *" in page.locator("table.grid").inner_text()
        page.screenshot(path=str(artifacts / f"{_name(jq)}-9-periodic.png"), full_page=True)
    finally:
        page.close()
