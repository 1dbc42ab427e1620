"""What identifies a worker and what it counts: its id, its validated
queue shares, and :class:`WorkerStats` (thread-safe counting of claims and of
the outcomes written).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jobkeeper.errors import ConfigError
from jobkeeper.models import HANDED_BACK, Completion, Failure

Outcome = Completion | Failure


def make_worker_id() -> str:
    """``host:pid:random``: the random part means a restarted process with the
    same host name and pid (a container's PID 1) never inherits a dead run's
    liveness (procrastinate#1518).
    """
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def checked_shares(
    shares: Mapping[str, int], queues: Sequence[str], concurrency: int
) -> dict[str, int]:
    """``queue_shares``, validated (see :class:`Worker`).

    Raises:
        ConfigError: naming the queue and the value.
    """
    for queue, share in shares.items():
        if queue not in queues:
            raise ConfigError(
                f"queue_shares[{queue!r}]: the worker does not serve that queue "
                f"(its queues: {', '.join(queues)})"
            )
        if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= concurrency:
            raise ConfigError(
                f"queue_shares[{queue!r}]: a share must be an int between 1 and the "
                f"worker's concurrency {concurrency}, got {share!r}"
            )
    return dict(shares)


@dataclass
class WorkerStats:
    """What one worker did (returned by :meth:`Worker.run`).

    ``failed`` counts attempts that raised and will be retried or are dead;
    ``snoozed`` and ``cancelled`` their own outcomes; ``released`` the jobs
    handed back unrun or unfinished. ``by_outcome`` has every count by
    outcome name (``"completed"``, ``"retryable"``, ``"dead"``, ...; str keys).
    """

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    snoozed: int = 0
    cancelled: int = 0
    lost_claims: int = 0
    released: int = 0
    exit_code: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def count_claimed(self, claimed: int) -> None:
        """``claimed`` more jobs claimed (any thread)."""
        with self._lock:
            self.claimed += claimed

    def count_written(self, batch: list[Outcome], written: set[int]) -> None:
        """One flushed batch: each outcome written (by kind) or refused."""
        with self._lock:
            for outcome in batch:
                if outcome.claim.job_id not in written:
                    self.lost_claims += 1
                    continue
                # str keys: FailureKind is a StrEnum, and a mix of members
                # and strings printed unlike the documented {"completed": 2}.
                kind = "completed" if isinstance(outcome, Completion) else str(outcome.outcome)
                self.by_outcome[kind] = self.by_outcome.get(kind, 0) + 1
                if kind == "completed":
                    self.completed += 1
                elif kind in HANDED_BACK:
                    self.released += 1
                elif kind == "snoozed":
                    self.snoozed += 1
                elif kind == "cancelled":
                    self.cancelled += 1
                else:
                    self.failed += 1
