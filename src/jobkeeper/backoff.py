"""Retry backoff: exponential with full jitter and a cap.

``delay(attempt) = uniform(0, min(base ** attempt, max_backoff))`` seconds: the
"full jitter" shape from AWS's *Exponential Backoff and Jitter* (Brooker, 2015),
with the exponential-then-capped ceiling that Oban's and River's defaults share.
The ceiling is computed in log space, so attempt 10**9 is as safe as attempt 1
(procrastinate#1462: a datetime overflow inside the retry path lost the job).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

#: Default exponential base.
DEFAULT_BASE = 2.0
#: Default cap in seconds (24 h, River's maximum).
DEFAULT_MAX_BACKOFF = 86_400.0
#: No delay is ever larger than this many seconds (about 100 years), whatever
#: the settings, so ``now + delay`` is storable in every backend.
ABSOLUTE_MAX_BACKOFF = 100 * 365.25 * 86_400.0


def backoff_ceiling(
    attempt: int, *, base: float = DEFAULT_BASE, max_backoff: float = DEFAULT_MAX_BACKOFF
) -> float:
    """The largest delay (seconds) full jitter may pick after ``attempt``.

    Args:
        attempt: the attempt that just failed, >= 1 (values < 1 count as 1).
        base: exponential base, > 1.
        max_backoff: cap in seconds, >= 0; clamped to ``ABSOLUTE_MAX_BACKOFF``.

    Returns:
        ``min(base ** attempt, max_backoff)``, finite and non-decreasing in ``attempt``.
    """
    # A NaN cap would slip through min/max and let base ** attempt run away.
    cap = ABSOLUTE_MAX_BACKOFF if math.isnan(max_backoff) else max_backoff
    cap = min(max(cap, 0.0), ABSOLUTE_MAX_BACKOFF)
    attempt = max(int(attempt), 1)
    if cap == 0.0:
        return 0.0
    # Compare exponents instead of computing base ** attempt, which overflows
    # a float near attempt 1024 for base 2.
    if attempt * math.log(base) >= math.log(cap):
        return cap
    # min(): near the cap the log comparison and the power round differently
    # (5.0 ** 9 can exceed a cap the logs said it was below).
    return min(float(base**attempt), cap)


def backoff_delay(
    attempt: int,
    *,
    base: float = DEFAULT_BASE,
    max_backoff: float = DEFAULT_MAX_BACKOFF,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before retrying after ``attempt`` failed (full jitter).

    Args:
        attempt: the attempt that just failed (1 for the first).
        base: exponential base, > 1.
        max_backoff: cap in seconds.
        rand: a source of uniform floats in [0, 1); pass a seeded one in tests.

    Returns:
        A delay in ``[0, backoff_ceiling(attempt)]`` seconds.
    """
    return rand() * backoff_ceiling(attempt, base=base, max_backoff=max_backoff)
