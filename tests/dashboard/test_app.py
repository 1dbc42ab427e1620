"""The dashboard app through Starlette's TestClient, on both backends."""

from __future__ import annotations

import base64
import html
import re
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

from jobkeeper import JobQueue
from jobkeeper.dashboard import create_app
from jobkeeper.dashboard.app import CSRF_COOKIE, PASSWORD_ENV
from jobkeeper.dashboard.present import rate
from jobkeeper.dashboard.security import Csrf
from jobkeeper.models import Failure, JobStatus, WorkerInfo
from jobkeeper.outcomes import claim_of
from support.db import sql

from .conftest import _token


def test_every_page_renders_and_links_from_the_overview(client, seeded):
    overview = client.get("/")
    assert overview.status_code == 200
    html = overview.text
    for link in ('href="/jobs"', 'href="/dead"', 'href="/workers"', 'href="/jobs?queue=emails"',
                 'href="/metrics"', "/static/style.css"):  # fmt: skip
        assert link in html
    for path in ("/jobs", "/dead", "/workers", f"/jobs/{seeded.retryable}",
                 f"/jobs/{seeded.dead}", f"/jobs/{seeded.running}", f"/jobs/{seeded.scheduled}",
                 f"/jobs/{seeded.completed[0]}", f"/jobs/{seeded.cancelled}",
                 f"/jobs/{seeded.available[0]}", "/static/style.css", "/metrics"):  # fmt: skip
        response = client.get(path)
        assert response.status_code == 200, path
    assert "text/html" in overview.headers["content-type"]


def test_overview_counts_queues_and_statuses(client, jq):
    html = client.get("/").text
    counts = jq.stats()
    assert counts["default"]["completed"] == 12
    assert '<a href="/jobs?status=completed&amp;queue=default">12</a>' in html
    assert '<a href="/dead?queue=reports">1</a>' in html
    # The throughput chart counts the 12 completed jobs and the cancelled one.
    assert "13 in all" in html
    # 13 in the hour, 0.22 a minute: shown as not zero (it read "0.2").
    assert '<span class="value">0.22</span>' in html


@pytest.mark.parametrize(
    ("per_minute", "shown"),
    [
        (0, "0"),
        (2 / 60, "0.033"),
        (0.1, "0.1"),
        (13 / 60, "0.22"),
        (1.5, "1.5"),
        (99.96, "100"),
        (1234.4, "1,234"),
    ],
)
def test_a_rate_keeps_the_digits_that_show_it_is_not_zero(per_minute, shown):
    # Found by a break-test: 2 jobs in the hour showed as "0.0" a minute.
    assert rate(per_minute) == shown


def test_job_page_shows_args_result_errors_and_why(client, seeded):
    html = client.get(f"/jobs/{seeded.retryable}").text
    assert "&#34;invoice&#34;: 77" in html or '"invoice": 77' in html
    assert "connection refused" in html and "Traceback (most recent call last)" in html
    assert "next attempt in" in html
    html = client.get(f"/jobs/{seeded.completed[0]}").text
    assert "&#34;sent&#34;: true" in html or '"sent": true' in html
    html = client.get(f"/jobs/{seeded.available[0]}").text
    assert "worker(s) serve queue" in html
    html = client.get(f"/jobs/{seeded.running}").text
    assert f"Running on worker {seeded.worker_id}" in html
    assert client.get("/jobs/999999").status_code == 404
    assert client.get("/jobs/nope").status_code == 404


def test_job_page_shows_args_and_result_as_stored_and_escaped(client, jq):
    # Found by a break-test: Jinja's tojson wrote <, >, & and ' as \u003c and
    # so on, so an operator read "\u0026" in a URL where `jobs show` printed "&".
    args = {"url": "https://x.test/?a=1&b=2", "msg": "<script>alert('x')</script>", "é": "ü"}
    job = jq.enqueue("shown", args)
    html = client.get(f"/jobs/{job.id}").text
    assert "\\u00" not in html
    assert "https://x.test/?a=1&amp;b=2" in html
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html and "<script>alert" not in html
    assert "&#34;é&#34;: &#34;ü&#34;" in html


def test_available_job_without_a_worker_says_so(client, jq):
    job = jq.enqueue("lonely", {}, queue="nobody")
    assert "No live worker serves queue &#39;nobody&#39;" in client.get(f"/jobs/{job.id}").text


def test_job_page_says_a_paused_queue_or_a_held_serial_key_holds_a_job(client, jq):
    # Issue 15, item 7: what `jobs show` says, the job page says too.
    first = jq.enqueue("sync", {}, queue="users", serial_key="user:42")
    second = jq.enqueue("sync", {}, queue="users", serial_key="user:42")
    assert [j.id for j in jq.backend.job_claim(worker_id="w-1", queue="users", limit=5)] == [
        first.id
    ]
    html = client.get(f"/jobs/{second.id}").text
    assert f"Its serial key &#39;user:42&#39; is held by job {first.id}" in html
    jq.pause("users")
    assert "Queue &#39;users&#39; is paused" in client.get(f"/jobs/{second.id}").text


def test_job_page_names_the_lone_attempt_that_holds_every_worker(client, jq):
    # A crash suspect running alone keeps its worker from claiming: the
    # page's "every slot is busy" line alone left that out.
    now = jq.backend.db_now()
    worker = WorkerInfo("w-1", "host", 1, ["solo"], now, now, rescue_after=60.0)
    jq.backend.worker_register(worker=worker)
    suspect = jq.enqueue("sync", {}, queue="solo")
    waiting = jq.enqueue("sync", {}, queue="solo")
    sql(jq, f"UPDATE jobkeeper_jobs SET run_alone = true WHERE id = {suspect.id}")
    (held,) = jq.backend.job_claim(worker_id="w-1", queue="solo", limit=1)
    assert jq.backend.job_start_alone(claim=claim_of(held))
    html = client.get(f"/jobs/{waiting.id}").text
    assert "Every live worker serving queue &#39;solo&#39; is given over to a lone attempt" in html
    assert f"job {suspect.id} runs alone on worker w-1" in html


def _ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<a class="strong" href="/jobs/(\d+)">', html)]


def test_filters(client, seeded):
    assert _ids(client.get("/jobs?status=available").text) == sorted(seeded.available, reverse=True)
    emails = _ids(client.get("/jobs?queue=emails").text)
    assert set(emails) == {*seeded.available, seeded.running, seeded.cancelled}
    assert _ids(client.get("/jobs?task=render_report").text) == [seeded.scheduled, seeded.dead]
    assert _ids(client.get("/jobs?status=dead").text) == [seeded.dead]
    assert _ids(client.get("/dead?task=render_report").text) == [seeded.dead]
    assert _ids(client.get("/dead?queue=emails").text) == []
    assert client.get("/jobs?status=bogus").status_code == 400
    for bad in ("abc", "\u0661\u0662", " 1", "0", "1" * 5000):  # \u0661\u0662: int() reads 12
        response = client.get("/jobs", params={"before": bad})
        text = html.unescape(response.text)
        assert response.status_code == 400 and f"before={bad!r} is not a job id" in text


def test_keyset_paging(jq, client, monkeypatch):
    monkeypatch.setattr("jobkeeper.dashboard.app.PAGE_SIZE", 5)
    first = client.get("/jobs?queue=default").text
    page1 = _ids(first)
    assert len(page1) == 5
    match = re.search(r'<a href="\?([^"]+)" rel="next">', first)
    assert match and f"before={page1[-1]}" in match.group(1)
    second = client.get("/jobs?" + match.group(1).replace("&amp;", "&")).text
    page2 = _ids(second)
    assert len(page2) == 5 and max(page2) < min(page1)
    everything = [j.id for j in jq.list_jobs(queue="default", limit=100)]
    seen = page1 + page2
    while 'rel="next"' in second:
        match = re.search(r'<a href="\?([^"]+)" rel="next">', second)
        second = client.get("/jobs?" + match.group(1).replace("&amp;", "&")).text
        seen += _ids(second)
    assert seen == everything


def test_only_the_dashboards_own_flash_messages_are_shown(client, seeded, monkeypatch):
    # Found by break-tests: /?flash=... showed anyone's text in the banner
    # that says what an action did (73); a signed message could then be shown
    # on any page, at any later time, and the CSRF cookie's nonce.signature
    # passed as a signed message (74).
    token = _token(client)
    response = client.post(
        f"/jobs/{seeded.retryable}/retry", data={"csrf_token": token}, follow_redirects=False
    )
    location = response.headers["location"]
    html = client.get(location).text
    assert f'<p class="flash" role="status">Job {seeded.retryable} is available again.</p>' in html
    query = location.split("?", 1)[1]
    nonce, _, signature = token.partition(".")
    refused = [
        location.replace("is+available+again", "is+safe+to+delete"),  # altered
        "/?flash=Everything+is+fine",  # unsigned
        location.split("&flash_sig=")[0],  # signature dropped
        f"/?{query}",  # another page
        f"/jobs/{seeded.completed[0]}?{query}",  # another job's page
        f"/?flash={nonce}&flash_sig={signature}",  # the CSRF token
    ]
    for url in refused:
        html = client.get(url).text
        assert 'class="flash"' not in html and "safe to delete" not in html, url
    # Shown again on a reload within a minute, not after.
    import jobkeeper.dashboard.app as app_module

    later = app_module.wall_clock() + 61
    monkeypatch.setattr(app_module, "wall_clock", lambda: later)
    assert 'class="flash"' not in client.get(location).text


def test_retry_cancel_requeue_delete_by_post(client, jq, seeded):
    token = _token(client)
    response = client.post(
        f"/jobs/{seeded.retryable}/retry", data={"csrf_token": token}, follow_redirects=False
    )
    assert response.status_code == 303
    assert response.headers["location"].startswith(f"/jobs/{seeded.retryable}?flash=")
    assert jq.get_job(seeded.retryable).status == JobStatus.AVAILABLE

    client.post(f"/jobs/{seeded.scheduled}/cancel", data={"csrf_token": token})
    assert jq.get_job(seeded.scheduled).status == JobStatus.CANCELLED

    client.post(f"/dead/{seeded.dead}/requeue", data={"csrf_token": token})
    assert jq.get_job(seeded.dead).status == JobStatus.AVAILABLE

    doomed = _make_dead(jq, seeded)
    response = client.post(f"/dead/{doomed}/delete", data={"csrf_token": token})
    assert response.status_code == 200 and "deleted" in response.text
    assert jq.get_job(doomed) is None

    # Wrong state and unknown ids: a page saying so, nothing changed.
    response = client.post(f"/jobs/{seeded.available[0]}/retry", data={"csrf_token": token})
    assert response.status_code == 409 and "only dead" in response.text
    assert client.post("/dead/424242/delete", data={"csrf_token": token}).status_code == 404
    assert (
        client.post(f"/jobs/{seeded.running}/explode", data={"csrf_token": token}).status_code
        == 404
    )
    # Ids that are not ids: a 404 naming what was given (was a 409 quoting int()).
    for bad in ("abc", "0", "-1", "1e3", "99999999999999999999", "%D9%A3"):
        for action in (f"/jobs/{bad}/retry", f"/dead/{bad}/delete"):
            response = client.post(action, data={"csrf_token": token})
            assert response.status_code == 404, (action, response.status_code)
            assert "positive number" in response.text and "int()" not in response.text
        assert client.get(f"/jobs/{bad}").status_code == 404


def _make_dead(jq, seeded) -> int:

    job = jq.enqueue("doomed", {}, queue="doom", max_attempts=1)
    (claimed,) = jq.backend.job_claim(worker_id=seeded.worker_id, queue="doom", limit=1)
    assert claimed.id == job.id
    jq.backend.job_fail_many(
        failures=[Failure(claim_of(claimed), "dead", '{"attempt": 1, "error": "x"}')]
    )
    return job.id


def test_csrf_refusals(client, jq, seeded):
    token = _token(client)
    target = f"/jobs/{seeded.retryable}/retry"
    assert client.post(target).status_code == 403  # no field
    assert client.post(target, data={"csrf_token": "forged.abc"}).status_code == 403
    # A token that is well formed but not the cookie's (another session's).
    other = TestClient(client.app)
    other_token = _token(other)
    assert other_token != token
    assert client.post(target, data={"csrf_token": other_token}).status_code == 403
    # No cookie at all (a cross-site form post carries none: SameSite=Strict).
    bare = TestClient(client.app)
    assert bare.post(target, data={"csrf_token": token}).status_code == 403
    # A cookie and field that match but were not signed by this app.
    forged = TestClient(client.app, cookies={CSRF_COOKIE: "nonce.deadbeef"})
    assert forged.post(target, data={"csrf_token": "nonce.deadbeef"}).status_code == 403
    # Not ASCII, in the field or in a cookie that matches it (a 500 before:
    # compare_digest refuses such str).
    assert client.post(target, data={"csrf_token": "é"}).status_code == 403
    csrf = Csrf(b"secret")
    for cookie, field in (("n\u00e9.d\u00e9", "n\u00e9.d\u00e9"), ("a.b", "\udcff"), ("é", "é")):
        assert csrf.valid(cookie, field) is False
    good = csrf.new_token()
    assert csrf.valid(good, good) is True
    assert jq.get_job(seeded.retryable).status == JobStatus.RETRYABLE
    assert client.post(target, data={"csrf_token": token}).status_code == 200
    assert jq.get_job(seeded.retryable).status == JobStatus.AVAILABLE


def test_read_only(jq, seeded, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    client = TestClient(create_app(jq, read_only=True))
    for path in (f"/jobs/{seeded.retryable}", f"/jobs/{seeded.dead}", "/dead"):
        html = client.get(path).text
        assert 'method="post"' not in html
        assert not {"Retry", "Cancel", "Requeue", "Delete"} & set(
            re.findall(r">(\w+)</button>", html)
        )
        assert "read-only" in html
    for action in (f"/jobs/{seeded.retryable}/retry", f"/jobs/{seeded.available[0]}/cancel",
                   f"/dead/{seeded.dead}/requeue", f"/dead/{seeded.dead}/delete"):  # fmt: skip
        assert client.post(action, data={"csrf_token": "x"}).status_code == 403
    assert jq.get_job(seeded.retryable).status == JobStatus.RETRYABLE
    assert jq.get_job(seeded.dead).status == JobStatus.DEAD


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize("from_env", [False, True])
def test_basic_auth_on_every_route(jq, seeded, monkeypatch, from_env):
    if from_env:
        monkeypatch.setenv(PASSWORD_ENV, "s3cret")
        app = create_app(jq)
    else:
        monkeypatch.delenv(PASSWORD_ENV, raising=False)
        app = create_app(jq, password="s3cret")
    client = TestClient(app)
    paths = ["/", "/jobs", "/dead", "/workers", "/metrics", f"/jobs/{seeded.dead}",
             "/static/style.css", "/nowhere"]  # fmt: skip
    for path in paths:
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"].startswith("Basic")
        assert client.get(path, headers=_basic("jobkeeper", "wrong")).status_code == 401
        assert client.get(path, headers=_basic("admin", "s3cret")).status_code == 401
    assert client.post(f"/jobs/{seeded.retryable}/retry").status_code == 401
    auth = _basic("jobkeeper", "s3cret")
    for path in paths[:-1]:
        assert client.get(path, headers=auth).status_code == 200, path
    assert jq.get_job(seeded.retryable).status == JobStatus.RETRYABLE


def test_mounted_under_a_prefix(jq, seeded, monkeypatch):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    outer = Starlette(routes=[Mount("/ops/jobs", app=create_app(jq))])
    client = TestClient(outer)
    html = client.get("/ops/jobs/").text
    assert 'href="/ops/jobs/dead"' in html and "/ops/jobs/static/style.css" in html
    assert client.get("/ops/jobs/static/style.css").status_code == 200
    token = _token(client, "/ops/jobs/dead")
    response = client.post(
        f"/ops/jobs/jobs/{seeded.retryable}/retry",
        data={"csrf_token": token},
        follow_redirects=False,
    )
    assert response.headers["location"].startswith(f"/ops/jobs/jobs/{seeded.retryable}")


def test_queues_page_shows_limits_and_pauses_and_resumes_by_post(client, jq, seeded):
    jq.configure_queue("emails", concurrency=3, rate_limit="10/s", max_pending=500)
    jq.configure_queue("ops:nightly/2", concurrency=1)  # a name with ':' and '/'
    html = client.get("/queues").text
    assert 'href="/queues"' in html  # in the navigation
    for text in (">emails</a>", "10/s", ">500<", "ops:nightly/2", ">Pause</button>"):
        assert text in html, text
    # The state's word is the CLI's (queues list): "running" is a job status.
    assert ">active</span>" in html and ">running</span>" not in html
    token = _token(client, "/queues")

    response = client.post(
        "/queues/pause",
        data={"csrf_token": token, "queue": "ops:nightly/2"},
        follow_redirects=False,
    )
    assert response.status_code == 303 and response.headers["location"].startswith("/queues?")
    assert {q.name: q.paused for q in jq.queues()}["ops:nightly/2"] is True
    html = client.get("/queues").text
    assert ">paused<" in html and ">Resume</button>" in html
    resumed = client.post("/queues/resume", data={"csrf_token": token, "queue": "ops:nightly/2"})
    assert "Queue ops:nightly/2 is not paused" in resumed.text
    assert {q.name: q.paused for q in jq.queues()}["ops:nightly/2"] is False
    # Resuming a queue that was never paused says so, not "running again".
    never = client.post("/queues/resume", data={"csrf_token": token, "queue": "nosuch"})
    assert "Queue nosuch is not paused" in never.text and "again" not in never.text

    # Refusals: no token, a bad name, an unknown action; nothing changed.
    assert client.post("/queues/pause", data={"queue": "emails"}).status_code == 403
    bad = client.post("/queues/pause", data={"csrf_token": token, "queue": "no spaces"})
    assert bad.status_code == 400 and "queue name" in bad.text
    assert (
        client.post("/queues/drop", data={"csrf_token": token, "queue": "emails"}).status_code
        == 404
    )
    # No queue field, an empty one, or two: a 400 saying so (was a 404
    # "unknown action"; an empty field said "got 0").
    for fields, said in (
        ({}, "queue field is missing or empty"),
        ({"queue": ""}, "queue field is missing or empty"),
        ({"queue": ["emails", "other"]}, "one queue field, got 2"),
    ):
        missing = client.post("/queues/pause", data={"csrf_token": token, **fields})
        assert missing.status_code == 400 and said in missing.text, fields
    assert not any(q.paused for q in jq.queues())


def test_queues_page_is_read_only_when_asked(jq, seeded, monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    client = TestClient(create_app(jq, read_only=True))
    html = client.get("/queues").text
    assert 'method="post"' not in html and "emails" in html
    assert (
        client.post("/queues/pause", data={"csrf_token": "x", "queue": "emails"}).status_code == 403
    )
    assert not any(q.paused for q in jq.queues())


def test_periodic_page_lists_stored_schedules(client, jq):
    assert "No periodic job is stored" in client.get("/periodic").text
    jq.periodic("*/15 * * * *", task="cleanup", timezone="Europe/Paris", queue="maintenance")
    jq.periodic(every=30, task="poll_feeds")
    from jobkeeper.maintenance.periodic import PeriodicEnqueuer

    PeriodicEnqueuer(jq.backend, list(jq.periodics.values())).run_once()
    html = client.get("/periodic").text
    for text in ("*/15 * * * *", "Europe/Paris", "every 30s", ">cleanup</a>", ">maintenance</a>",
                 ">poll_feeds</a>"):  # fmt: skip
        assert text in html, text
    assert "stale" not in html.split("<tbody>")[1].split("</tbody>")[0]


def _periodic_rows(client: TestClient) -> dict[str, str]:
    """The periodic page's rows as text, by name."""
    body = client.get("/periodic").text.split("<tbody>")[1].split("</tbody>")[0]
    rows = {}
    for row in body.split("<tr>")[1:]:
        cells = [
            html.unescape(re.sub(r"<[^>]+>", "", "<td" + cell)).strip()
            for cell in row.split("<td")[1:]
        ]
        rows[cells[0]] = " | ".join(cells)
    return rows


def test_periodic_page_says_when_no_worker_fires_the_next_tick(client, jq):
    # Left over from an earlier break-test: with no worker running, the next
    # tick read "9 min ago", as if it had run; nothing said it was overdue.
    from jobkeeper.maintenance.periodic import ALIVE_SLACK, PeriodicEnqueuer
    from jobkeeper.periodic import OVERDUE_AFTER
    from periodic.helpers import fabricate

    assert OVERDUE_AFTER >= ALIVE_SLACK  # a live worker's tick is never called overdue
    for task in ("gone", "stopped", "parked", "live"):
        jq.periodic(every=3600 if task in ("parked", "live") else 60, task=task)
    PeriodicEnqueuer(jq.backend, list(jq.periodics.values())).run_once()
    now = jq.backend.db_now()
    # No worker for 10 minutes (stale, default stale_after 15 s here): overdue.
    fabricate(jq.url.url, "gone", seen_at=now - timedelta(minutes=10),
              next_tick_at=now - timedelta(minutes=9))  # fmt: skip
    # Seen just now but its tick a minute past: no worker fired it (not stale yet).
    fabricate(jq.url.url, "stopped", seen_at=now, next_tick_at=now - timedelta(minutes=1))
    # No worker, next tick still ahead: nothing will fire it either.
    fabricate(jq.url.url, "parked", seen_at=now - timedelta(minutes=10))

    rows = _periodic_rows(client)
    assert "9 min ago · overdue: no running worker schedules it" in rows["gone"], rows
    assert "1 min ago · overdue: no worker has fired it" in rows["stopped"], rows
    assert (
        "in " in rows["parked"]
        and "not scheduled: no running worker registers it" in rows["parked"]
    ), rows
    live = rows["live"]
    assert "in " in live and "overdue" not in live and "not scheduled" not in live, rows


def test_pages_and_metrics_answer_503_while_the_database_is_unavailable():
    # Found by a break-test: GET pages and /metrics answered 500 (a dashboard
    # fault) when the database was down; the POST forms already said 503.
    down = JobQueue("postgresql://postgres@127.0.0.1:1/test?connect_timeout=1")
    try:
        client = TestClient(create_app(down))
        for page in (
            "/",
            "/jobs",
            "/jobs/1",
            "/dead",
            "/workers",
            "/queues",
            "/periodic",
            "/metrics",
        ):
            response = client.get(page)
            assert response.status_code == 503, (page, response.status_code, response.text)
            assert "database unavailable" in response.text
            assert response.headers["retry-after"] == "5"
        # A request refused for itself says so, database or not (it read
        # the database's clock for the page's footer: 503).
        response = client.get("/jobs?before=abc")
        assert response.status_code == 400, response.text
        assert "is not a job id" in response.text
        assert "database clock" not in response.text
    finally:
        down.close()


def test_job_page_shows_the_serial_key_and_a_crash_suspect(client, jq):
    # Found by a break-test: a job waiting on its serial key did not show it.
    from support.db import sql

    job = jq.enqueue("keyed", {}, serial_key="user:42")
    html = client.get(f"/jobs/{job.id}").text
    assert '<dt>Serial key</dt><dd class="mono">user:42</dd>' in html
    assert "Runs alone" not in html and "Crashes" not in html
    sql(jq, "UPDATE jobkeeper_jobs SET run_alone = ?, crashes = 2 WHERE id = ?", [True, job.id])
    html = client.get(f"/jobs/{job.id}").text
    assert "<dt>Runs alone</dt>" in html and "<dt>Crashes</dt><dd>2:" in html


def test_workers_page_tells_builds_apart_by_their_schema_version(client, jq):
    # Every build recorded "0.1.0": a rolling deploy's old and new workers
    # looked alike. A worker from before versions were recorded shows a dash
    # (the template printed "None").
    from datetime import UTC, datetime

    from jobkeeper.models import WorkerInfo
    from jobkeeper.version import __version__
    from support.db import sql

    now = datetime.now(UTC)
    for worker_id in ("w-new", "w-unversioned"):
        jq.backend.worker_register(worker=WorkerInfo(worker_id, "h", 1, ["q"], now, now))
    sql(jq, "UPDATE jobkeeper_workers SET version = NULL WHERE id = ?", ["w-unversioned"])
    html = client.get("/workers").text
    schema = jq.backend.schema_expected()
    assert f'<td class="muted">{__version__} (schema {schema})</td>' in html
    assert '<td class="muted">—</td>' in html and "None" not in html
