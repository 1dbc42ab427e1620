"""IntervalService: what it says about the database after a failed pass."""

from __future__ import annotations

import logging

from jobkeeper.errors import DatabaseError
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
            raise DatabaseError("server down")


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
