"""The dashboard's ASGI app: server-rendered pages over one :class:`JobQueue`.

A client of the API like the CLI (riverui and Oban Web read through their
libraries the same way): it imports ``jobkeeper.api`` and never a backend or
SQL. Every page is plain HTML that works without JavaScript; every action is
a POST carrying a CSRF token and is refused (403) in read-only mode.

CSRF: a signed double-submit cookie. The first page sets ``jobkeeper_csrf``
to ``nonce.HMAC(secret, nonce)`` (HttpOnly, SameSite=Strict); each form
carries the same value in a hidden field. A POST passes only when the field
equals the cookie and the signature verifies with this app's secret, so
another site can neither read the token nor plant a cookie of its own.

Authentication: with a password (``password=`` or
``$JOBKEEPER_DASHBOARD_PASSWORD``) every route, ``/metrics`` and the static
files included, needs HTTP basic auth as user ``jobkeeper``.

Extension points: :data:`~jobkeeper.dashboard.nav.NAV` lists the pages in
the navigation bar (see :mod:`jobkeeper.dashboard.nav`), and a page's routes
go in :func:`create_app`.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from time import time as wall_clock
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobkeeper.api import JobQueue
from jobkeeper.config import check_seconds
from jobkeeper.dashboard.actions import act_on_job, no_such_id
from jobkeeper.dashboard.bounded import DATABASE_TIMEOUT, BoundedRunner
from jobkeeper.dashboard.nav import NAV, NavEntry
from jobkeeper.dashboard.params import job_id_of, path_job_id
from jobkeeper.dashboard.present import (
    ago,
    duration,
    next_tick_note,
    number,
    pretty_json,
    rate,
    stamp,
    why_waiting,
)
from jobkeeper.dashboard.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    PASSWORD_ENV,
    BasicAuth,
    Csrf,
    dashboard_password,
    is_loopback,
)
from jobkeeper.errors import (
    ConfigError,
    DatabaseUnavailable,
    JobkeeperError,
)
from jobkeeper.models import JobStatus
from jobkeeper.waits import explain_wait

#: The reasons of :func:`jobkeeper.waits.explain_wait` the job page adds to
#: :func:`~jobkeeper.dashboard.present.why_waiting`'s line.
_LIMIT_REASONS = frozenset(
    {
        "paused",
        "concurrency",
        "rate_limit",
        "serial_key",
        "holder_silent",
        "old_workers",
        "lone_attempt",
    }
)
#: Rows per page of the job lists.
PAGE_SIZE = 50
#: The overview's throughput window and bucket, seconds.
THROUGHPUT_WINDOW = 3600.0
THROUGHPUT_BUCKET = 60.0
#: Largest form body read, bytes (forms carry a token and nothing else).
MAX_FORM_BYTES = 4096

HELD = frozenset({JobStatus.CLAIMED, JobStatus.RUNNING})
#: Order of the status columns (the lifecycle, left to right).
STATUS_ORDER = [
    "scheduled",
    "available",
    "claimed",
    "running",
    "retryable",
    "completed",
    "cancelled",
    "dead",
]


# -- the app ---------------------------------------------------------------------


class Dashboard:
    """The pages and actions of one dashboard (one per :func:`create_app`)."""

    def __init__(
        self,
        jq: JobQueue,
        *,
        read_only: bool,
        secret: bytes,
        database_timeout: float = DATABASE_TIMEOUT,
    ) -> None:
        self.jq = jq
        self.read_only = read_only
        # Every page, scrape and action runs here: a frozen server is
        # answered with a 503 at the bound, not waited for. On SQLite an
        # action behind another connection's write lock gives up at the
        # bound too, not at busy_timeout (30 s) holding one of the threads.
        self.runner = BoundedRunner(
            database_timeout,
            backend=jq.url.scheme,
            prepare=lambda: jq.backend.connection_lock_wait(seconds=database_timeout),
        )
        self.csrf = Csrf(secret)
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("jobkeeper.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            duration=duration, stamp=stamp, number=number, pretty_json=pretty_json, rate=rate
        )

    # -- rendering -------------------------------------------------------------

    def render(
        self,
        request: Request,
        template: str,
        status_code: int = 200,
        *,
        database_clock: bool = True,
        **context: Any,
    ) -> HTMLResponse:
        cookie = request.cookies.get(CSRF_COOKIE)
        fresh = not cookie or not self.csrf.valid(cookie, cookie)
        token = self.csrf.new_token() if fresh or cookie is None else cookie
        now = context.pop("now", None)
        if now is None and database_clock:
            now = self.jq.backend.db_now()
        root = request.scope.get("root_path", "")
        path = request.url.path.removeprefix(root) or "/"
        flash = self.csrf.flash_message(path, request.query_params, wall_clock())
        html = self.env.get_template(template).render(
            request=request,
            root=root,
            nav=[entry for entry in NAV if entry.available(self.jq)],
            path=path,
            read_only=self.read_only,
            csrf_field=CSRF_FIELD,
            csrf_token=token,
            now=now,
            ago=lambda then: "—" if now is None else ago(then, now),
            database=self.jq.url.redacted(),
            flash=flash,
            section=context.pop("section", None),
            **context,
        )
        response = HTMLResponse(html, status_code=status_code)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE, token, httponly=True, samesite="strict", path=root or "/"
            )
        return response

    def error(self, request: Request, status_code: int, message: str) -> HTMLResponse:
        # Without the database's clock: a refused request is answered as
        # such (400, 403...) while the database is down too.
        return self.render(
            request, "error.html", status_code, database_clock=False, message=message
        )

    # -- pages -------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        jq = self.jq
        now = jq.backend.db_now()
        counts = jq.queue_counts()
        oldest = jq.oldest_due()
        workers = jq.workers()
        series = jq.throughput(THROUGHPUT_WINDOW, THROUGHPUT_BUCKET)
        finished = [sum(c.values()) for _, c in series]
        peak = max(finished) if finished else 0
        totals = {s: sum(q.get(s, 0) for q in counts.counts.values()) for s in STATUS_ORDER}
        queues = sorted(set(counts.counts) | set(oldest))
        return self.render(
            request,
            "overview.html",
            now=now,
            queues=queues,
            counts=counts.counts,
            estimated=counts.estimated,
            lower_bound=counts.lower_bound,
            statuses=STATUS_ORDER,
            totals=totals,
            oldest=oldest,
            workers=workers,
            series=series,
            finished_total=sum(finished),
            peak=peak,
            per_minute=sum(finished) / (THROUGHPUT_WINDOW / 60),
            serving={q: sum(1 for w in workers if q in w.queues) for q in queues},
        )

    def _job_list(self, request: Request, *, dead: bool) -> Response:
        params = request.query_params
        status = "dead" if dead else (params.get("status") or None)
        queue = params.get("queue") or None
        task = params.get("task") or None
        before_text = params.get("before") or None
        before = None
        if before_text is not None:
            before = job_id_of(before_text)
            if before is None:
                return self.error(
                    request,
                    400,
                    f"Bad filter: before={before_text!r} is not a job id (a positive number).",
                )
        try:
            jobs = self.jq.list_jobs(status, queue, PAGE_SIZE + 1, task=task, before=before)
        except (ConfigError, ValueError) as exc:
            return self.error(request, 400, f"Bad filter: {exc}")
        more = len(jobs) > PAGE_SIZE
        jobs = jobs[:PAGE_SIZE]
        filters = {"status": None if dead else status, "queue": queue, "task": task}
        kept = {k: v for k, v in filters.items() if v}
        next_url = f"?{urlencode({**kept, 'before': jobs[-1].id})}" if more and jobs else None
        first_url = f"?{urlencode(kept)}" if before is not None else None
        return self.render(
            request,
            "jobs.html",
            dead=dead,
            jobs=jobs,
            filters=filters,
            statuses=[s for s in STATUS_ORDER if s != "dead"],
            next_url=next_url,
            first_url=first_url,
            before=before,
            page_size=PAGE_SIZE,
        )

    def jobs(self, request: Request) -> Response:
        return self._job_list(request, dead=False)

    def dead_letters(self, request: Request) -> Response:
        return self._job_list(request, dead=True)

    def job(self, request: Request) -> Response:
        job_id = path_job_id(request)
        if job_id is None:
            return no_such_id(self, request)
        job = self.jq.get_job(job_id)
        if job is None:
            return self.error(request, 404, f"No job {job_id} (it may have been pruned).")
        now = self.jq.backend.db_now()
        waiting = None
        limits: list[str] = []
        if job.status in (JobStatus.AVAILABLE, JobStatus.SCHEDULED, JobStatus.RETRYABLE,
                          JobStatus.CLAIMED, JobStatus.RUNNING):  # fmt: skip
            waiting = why_waiting(job, self.jq.workers(), now)
            # What the line above cannot see: the queue's settings, its
            # serial key's holder, a silent holder (as `jobs show` says).
            limits = [
                reason.message[:1].upper() + reason.message[1:] + "."
                for reason in explain_wait(self.jq, job)
                if reason.code in _LIMIT_REASONS
            ]
        return self.render(
            request,
            "job.html",
            now=now,
            job=job,
            waiting=waiting,
            limits=limits,
            can_retry=job.status.value in ("dead", "retryable", "cancelled", "completed"),
            can_cancel=job.status.value
            in ("scheduled", "available", "claimed", "running", "retryable")
            and not (job.status in HELD and job.cancel_requested),
        )

    def workers(self, request: Request) -> Response:
        now = self.jq.backend.db_now()
        workers = self.jq.workers()
        rows = []
        for worker in workers:
            age = (now - worker.heartbeat_at).total_seconds()
            window = worker.rescue_after or self.jq.settings.rescue_after
            state = "stale" if age > window else ("late" if age > window / 2 else "ok")
            rows.append((worker, age, window, state))
        return self.render(request, "workers.html", now=now, rows=rows)

    def queues(self, request: Request) -> Response:
        queues = self.jq.queues()
        workers = self.jq.workers()
        rows = [
            (queue, queue.counts, sum(1 for w in workers if queue.name in w.queues))
            for queue in queues
        ]
        return self.render(request, "queues.html", rows=rows)

    def periodic(self, request: Request) -> Response:
        now = self.jq.backend.db_now()
        return self.render(
            request,
            "periodic.html",
            now=now,
            rows=self.jq.periodic_list(),
            tick_note=lambda row: next_tick_note(row, now),
        )

    # -- actions -------------------------------------------------------------------

    async def _checked_form(self, request: Request) -> dict[str, list[str]] | Response:
        """The POSTed form, or the refusal: read-only, or no valid CSRF token."""
        if self.read_only:
            return PlainTextResponse("read-only dashboard: actions are off\n", status_code=403)
        body = await request.body()
        form = parse_qs(body[:MAX_FORM_BYTES].decode("utf-8", "replace"))
        fields = form.get(CSRF_FIELD) or []
        field = fields[0] if fields else None
        if not self.csrf.valid(request.cookies.get(CSRF_COOKIE), field):
            return PlainTextResponse(
                "CSRF token missing or invalid: reload the page and try again\n",
                status_code=403,
            )
        return form

    async def action(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        # The status the page showed: a retry from a page that has gone stale
        # (the job completed since) is refused rather than run again.
        seen = {name: values[0] for name, values in form.items() if name.startswith("seen")}
        act = functools.partial(act_on_job, self, seen=seen)
        return await self.runner.run(act, request, action=True)

    async def queue_action(self, request: Request) -> Response:
        form = await self._checked_form(request)
        if isinstance(form, Response):
            return form
        names = form.get("queue") or []
        what = request.path_params["action"]
        if what not in ("pause", "resume"):
            return PlainTextResponse("unknown action\n", status_code=404)
        if not names:
            # parse_qs drops a blank field: "queue=" arrives as no field.
            return self.error(request, 400, "The form's queue field is missing or empty.")
        if len(names) != 1:
            return self.error(request, 400, f"The form needs one queue field, got {len(names)}.")

        def act(request: Request) -> Response:
            try:
                queue = (self.jq.pause if what == "pause" else self.jq.resume)(names[0])
            except ConfigError as exc:
                return self.error(request, 400, str(exc))
            except JobkeeperError as exc:
                return self.error(request, 503, str(exc))
            # Said of the state now, not as a change: resuming a queue that
            # was not paused (or does not exist yet) changes nothing.
            state = (
                "is paused: no worker starts its jobs"
                if queue.paused
                else "is not paused: workers start its jobs"
            )
            return self.see_other(request, "/queues", f"Queue {queue.name} {state}.")

        return await self.runner.run(act, request, action=True)

    def see_other(self, request: Request, path: str, message: str) -> RedirectResponse:
        """Post/redirect/get: back to a page that shows the outcome, signed
        for that page and this moment (see :meth:`Csrf.flash_params`).
        """
        root = request.scope.get("root_path", "")
        query = urlencode(self.csrf.flash_params(path, message, wall_clock()))
        return RedirectResponse(f"{root}{path}?{query}", status_code=303)

    def metrics(self, request: Request) -> Response:
        from jobkeeper.dashboard.metrics import render_metrics

        body, content_type = render_metrics(self.jq)
        return Response(body, media_type=content_type)

    def bounded(
        self, page: Callable[[Request], Response]
    ) -> Callable[[Request], Awaitable[Response]]:
        """``page`` as an endpoint whose database work is bounded (see
        :mod:`jobkeeper.dashboard.bounded`).
        """

        async def endpoint(request: Request) -> Response:
            return await self.runner.run(page, request)

        return endpoint


def create_app(
    jq: JobQueue,
    read_only: bool = False,
    *,
    password: str | None = None,
    secret: bytes | None = None,
    database_timeout: float = DATABASE_TIMEOUT,
) -> Starlette:
    """The dashboard as an ASGI app, to serve with uvicorn or mount in another
    app (``Mount("/jobs", app=create_app(jq))``; links follow the mount path).

    Args:
        jq: the queue to show (any :class:`JobQueue`; its tasks need not be
            registered).
        read_only: hide every action button and refuse every POST (403).
        password: require HTTP basic auth (user ``jobkeeper``) on every route;
            default ``$JOBKEEPER_DASHBOARD_PASSWORD`` (unset or empty: none).
        secret: the key that signs CSRF tokens (default: random per app, so
            forms of a restarted dashboard need a reload).
        database_timeout: seconds a page, ``/metrics`` or an action waits for
            the database; past that it answers 503 (a frozen server accepts
            and never answers). A POST so answered may still take effect
            when the server answers.

    Returns:
        A Starlette application.

    Raises:
        ConfigError: ``database_timeout`` is not a finite number > 0; the
            password is blank (only whitespace).
    """
    database_timeout = check_seconds("database_timeout", database_timeout, allow_zero=False)
    password = dashboard_password(password)
    dashboard = Dashboard(
        jq,
        read_only=read_only,
        secret=secret if secret is not None else secrets.token_bytes(32),
        database_timeout=database_timeout,
    )
    static = resources.files("jobkeeper.dashboard").joinpath("static")
    routes = [
        Route("/", dashboard.bounded(dashboard.overview), name="overview"),
        Route("/jobs", dashboard.bounded(dashboard.jobs), name="jobs"),
        Route("/jobs/{job_id}", dashboard.bounded(dashboard.job), name="job"),
        Route("/dead", dashboard.bounded(dashboard.dead_letters), name="dead"),
        Route("/workers", dashboard.bounded(dashboard.workers), name="workers"),
        Route("/queues", dashboard.bounded(dashboard.queues), name="queues"),
        Route("/queues/{action:str}", dashboard.queue_action, methods=["POST"]),
        Route("/periodic", dashboard.bounded(dashboard.periodic), name="periodic"),
        Route("/metrics", dashboard.bounded(dashboard.metrics), name="metrics"),
        Route("/{kind:str}/{job_id}/{action:str}", dashboard.action, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(static)), name="static"),
    ]
    middleware = [Middleware(BasicAuth, password=password)] if password else []

    async def server_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, DatabaseUnavailable):
            # Not the dashboard's fault, and it passes: a page (or a scrape
            # of /metrics) may ask again, as the POST forms' 503 says.
            return PlainTextResponse(
                f"database unavailable: {exc}\n", status_code=503, headers={"Retry-After": "5"}
            )
        return PlainTextResponse(f"dashboard error: {exc}\n", status_code=500)

    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={JobkeeperError: server_error},
    )
    app.state.dashboard = dashboard
    return app


__all__ = ["CSRF_COOKIE", "NAV", "PASSWORD_ENV", "NavEntry", "create_app", "is_loopback"]
