"""doctor's xmin check names a prepared transaction (two-phase commit): it
holds back vacuum like an open session, but outlives its session and shows
in no pg_stat_activity row, so the check missed it. Needs a private server:
prepared transactions are off (max_prepared_transactions = 0) by default.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from benchmarks.soak.pg import PrivatePostgres

from jobkeeper import JobQueue
from jobkeeper.doctor import run_checks

pytestmark = pytest.mark.slow


@pytest.fixture
def server() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres(database="doctor", settings={"max_prepared_transactions": "2"})
    try:
        pg.init()
        yield pg
    finally:
        pg.cleanup()


def test_doctor_names_a_prepared_transaction_holding_back_vacuum(server):
    with JobQueue(server.url) as jq:
        jq.migrate()
        with psycopg.connect(server.url) as conn:
            conn.execute("CREATE TABLE ledger (n int)")
            conn.commit()
            conn.execute("INSERT INTO ledger VALUES (1)")
            conn.execute("PREPARE TRANSACTION 'pay-it''s-42'")
        # Its session is gone; the transaction is not.
        time.sleep(1.2)
        horizon = {c.name: c for c in run_checks(jq, xmin_warn_after=1.0)}["xmin horizon"]
        assert horizon.level == "warn", horizon
        assert 'prepared transaction "pay-it\'s-42"' in horizon.message, horizon.message
        assert "ROLLBACK PREPARED 'pay-it''s-42'" in horizon.message, horizon.message
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("ROLLBACK PREPARED 'pay-it''s-42'")
        horizon = {c.name: c for c in run_checks(jq, xmin_warn_after=1.0)}["xmin horizon"]
        assert horizon.level == "ok", horizon
