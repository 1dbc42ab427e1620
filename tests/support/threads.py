"""Running a test's racers on threads and collecting what they raised."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


def run_threads(
    target: Callable[..., object], args: Iterable[tuple[Any, ...]], *, timeout: float = 120.0
) -> list[BaseException]:
    """Run ``target(*a)`` on one thread per ``a`` in ``args`` and join them
    all (each for up to ``timeout`` seconds). Returns what they raised, and
    a ``TimeoutError`` when some thread was still running: ``[]`` means every
    one returned.
    """
    errors: list[BaseException] = []

    def guarded(*call_args: Any) -> None:
        try:
            target(*call_args)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=call_args) for call_args in args]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    running = sum(thread.is_alive() for thread in threads)
    if running:
        errors.append(TimeoutError(f"{running} thread(s) still running after {timeout} s"))
    return errors
