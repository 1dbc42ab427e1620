"""IntervalService: what it says about the database after a failed pass."""

from __future__ import annotations

import logging

import pytest

from jobkeeper.errors import DatabaseError, DatabaseUnavailable
from jobkeeper.maintenance.service import IntervalService


class _Flaky(IntervalService):
    """Fails its first pass, then its passes are skipped (not the leader)
    until ``lead`` is set; then they succeed."""

    def __init__(self) -> None:
        self.lead = False
        self.calls = 0
        super().__init__("flaky", 0.01, only_when=lambda: self.calls == 0 or self.lead)

    def run_once(self) -> None:
        self.calls += 1
        if self.calls == 1:
            raise DatabaseUnavailable("server down")


def test_skipped_passes_do_not_report_the_database_reachable(caplog):
    caplog.set_level(logging.INFO, logger="jobkeeper")
    service = _Flaky()
    service.start()
    try:
        assert service.wait_passes(20, timeout=10)
        assert "server down" in caplog.text
        assert "reachable again" not in caplog.text  # skipped passes asked nothing
        service.lead = True
        passes = service.loop_passes
        assert service.wait_passes(passes + 3, timeout=10)
        assert "flaky: database reachable again" in caplog.text
    finally:
        service.stop()


class _FailsOnce(IntervalService):
    def __init__(self, error: DatabaseError) -> None:
        self.error = error
        self.calls = 0
        super().__init__("once", 0.01)

    def run_once(self) -> None:
        self.calls += 1
        if self.calls == 1:
            raise self.error


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (DatabaseUnavailable("server down"), "once: database reachable again"),
        # A live server answered each of these: "reachable again" sent
        # people looking for an outage that never was (a break-test).
        (DatabaseUnavailable("statement timeout", unreachable=False), "once: calls succeed again"),
        (DatabaseUnavailable("disk full", unreachable=False), "once: calls succeed again"),
        (DatabaseError("could not serialize", retry_asked=True), "once: calls succeed again"),
    ],
)
def test_what_a_pass_says_after_failures_depends_on_what_failed(caplog, error, said):
    caplog.set_level(logging.INFO, logger="jobkeeper")
    service = _FailsOnce(error)
    service.start()
    try:
        assert service.wait_passes(3, timeout=10)
    finally:
        service.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None
    assert str(error) in warnings[0].getMessage()
    assert said in caplog.text
    other = {"once: database reachable again", "once: calls succeed again"} - {said}
    assert other.pop() not in caplog.text


def test_a_session_closed_while_idle_is_run_again_at_once_without_a_warning(caplog):
    # The close landed after the check before use: nothing of the pass ran,
    # and a new session runs it. A warning (and "calls succeed again") for
    # each was the noise a break-test counted under idle_session_timeout.
    caplog.set_level(logging.DEBUG, logger="jobkeeper")
    closed = DatabaseUnavailable("closed the session", unreachable=False, retry_asked=True)
    service = _FailsOnce(closed)
    service.start()
    try:
        assert service.wait_passes(2, timeout=10)
    finally:
        service.stop()
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    assert "once: closed the session; running it again at once" in caplog.text
