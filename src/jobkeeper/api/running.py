"""Workers: building and running one for a ``JobQueue``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jobkeeper.api.base import DEFAULT_QUEUE, QueueBase
from jobkeeper.config import MAX_CONCURRENCY, check_name, is_int_between
from jobkeeper.errors import ConfigError, shown
from jobkeeper.queues import parse_queue_share


class RunningMixin(QueueBase):
    """Worker methods of :class:`~jobkeeper.JobQueue`."""

    if TYPE_CHECKING:  # the periodics mixin supplies it

        def check_periodics(self) -> None: ...

    # -- run -----------------------------------------------------------------

    def worker(
        self,
        queues: Sequence[str] | Mapping[str, int | None] | None = None,
        concurrency: int = 10,
        burst: bool = False,
        prefetch: int | None = None,
    ) -> Any:
        """A :class:`jobkeeper.worker.runner.Worker` for these queues, not started
        (``run_worker`` runs one). Validates like ``run_worker``.

        Raises:
            ConfigError: as ``run_worker``.
        """
        from jobkeeper.worker.runner import Worker

        queue_names, shares = _queue_shares(queues)
        if not queue_names:
            queue_names = self.default_queues()
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise ConfigError(f"concurrency must be an int, got {shown(concurrency)}")
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ConfigError(
                f"concurrency must be between 1 and {MAX_CONCURRENCY}, got {concurrency}"
            )
        self.check_periodics()
        extra: dict[str, Any] = {}
        if shares:
            for name, share in shares.items():
                if share > concurrency:
                    raise ConfigError(
                        f"queue {name!r}: its share {share} is more than the worker's "
                        f"concurrency {concurrency}"
                    )
            extra["queue_shares"] = shares
        return Worker(
            self.backend,
            self.tasks,
            self.settings,
            queues=queue_names,
            concurrency=concurrency,
            burst=burst,
            prefetch=prefetch,
            periodics=list(self.periodics.values()),
            events=self.events,
            **extra,
        )

    def default_queues(self) -> list[str]:
        """The queues a worker serves when none are named: every queue the
        registered tasks use, else ``["default"]``.
        """
        return sorted({task.queue for task in self.tasks.values()}) or [DEFAULT_QUEUE]

    def run_worker(
        self,
        queues: Sequence[str] | Mapping[str, int | None] | None = None,
        concurrency: int = 10,
        burst: bool = False,
        prefetch: int | None = None,
    ) -> int:
        """Run a worker in this thread until SIGTERM/SIGINT (or, with ``burst``,
        until nothing is available or due within ``poll_interval``).

        Args:
            queues: queue names to work (default: :meth:`default_queues`), or
                ``{queue: share}``: this worker runs at most ``share`` jobs of
                that queue at once, within ``concurrency`` (``None``: no
                share), so one slow queue cannot take every slot. A name may
                also be written ``"emails=5"``.
            concurrency: most jobs running at once (1..10,000).
            burst: drain and return.
            prefetch: jobs to claim beyond the free slots (0..10,000); ``None`` (default)
                adapts it to how long jobs take against how long a claim takes
                (none for jobs slower than a claim, up to ``concurrency``).

        Logging: when neither the ``jobkeeper`` logger nor the root logger
        has a handler (a script that set up no logging), the worker logs as
        ``jobkeeper worker`` does: INFO and up to stderr, one line per record
        (its start and stop, failed attempts, dead letters, rescues). Any
        handler on either logger (``logging.basicConfig()``, a framework's
        setup, a ``NullHandler`` on ``jobkeeper`` for silence) is left alone.

        Returns:
            0 after a clean stop; 1 if some outcomes could not be written
            (those jobs will be rescued and re-run).

        Raises:
            ConfigError: a bad queue name, concurrency or prefetch; a periodic
                naming a task this JobQueue neither registers nor lists in
                ``external_tasks`` (when it registers any).
            DatabaseUnavailable: with ``burst``, the database cannot be
                reached at start (without it, the worker waits for it).
            DatabaseError: the schema is behind this code's (run
                ``jobkeeper migrate``), or not there at all; or (SQLite) the
                database file was removed or replaced while the worker ran:
                it stops at once (its jobs are in the removed file).
        """
        from jobkeeper.worker.log_output import flush_installed, log_unless_configured

        worker = self.worker(queues, concurrency, burst, prefetch)
        log_unless_configured()
        try:
            stats = worker.run()
        finally:
            flush_installed()
        return int(stats.exit_code)


def _queue_shares(
    queues: Sequence[str] | Mapping[str, int | None] | None,
) -> tuple[list[str], dict[str, int]]:
    """Queue names in order and the per-queue shares among them, from a list
    (``"emails=5"`` allowed) or a ``{queue: share}`` mapping.

    Raises:
        ConfigError: a bad name or share, or a queue named twice with shares.
    """
    if not queues:
        return [], {}
    if isinstance(queues, str):
        raise ConfigError(f"queues must be a list of names or a mapping, got the string {queues!r}")
    items: list[tuple[str, int | None]] = []
    if isinstance(queues, Mapping):
        for name, share in queues.items():
            check_name("queue", name)
            if share is not None and not is_int_between(share, 1, MAX_CONCURRENCY):
                raise ConfigError(
                    f"queue {name!r}: share must be an int between 1 and {MAX_CONCURRENCY} "
                    f"(or None), got {shown(share)}"
                )
            items.append((name, share))
    else:
        items = [parse_queue_share(text) for text in queues]
    names = list(dict.fromkeys(name for name, _ in items))
    shares: dict[str, int] = {}
    for name, share in items:
        if share is not None:
            if name in shares and shares[name] != share:
                raise ConfigError(f"queue {name!r} is given two shares: {shares[name]} and {share}")
            shares[name] = share
    return names, shares
