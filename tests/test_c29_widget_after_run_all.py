"""Case C29: the failure lab widget after Run > Run All Cells.

Input: notebook 09 run top to bottom (its last cell, ``await h.close()``, closes the harness and drops the
database the widget uses), then the widget's Run clicked.
Right result: the widget keeps working (Run opens a fresh database of the same purpose and says so), and
an error that is not a lost server never says it is one. The browser test drives the same case in a real
JupyterLab (tests/test_browser.py).
"""

from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")

import psycopg
import pytest

from agentlab.lab.session import LabSession
from agentlab.lab.widget import FailureLab
from agentlab.runtime import db
from agentlab.runtime.harness import Harness, HarnessClosed
from agentlab.sim.provider import customer_ref

LOST = "lost the database server"


async def test_c29_the_widget_runs_after_the_notebooks_last_cell_closed_its_database():
    h = await Harness.open(purpose="nb09")
    session = LabSession(h)
    lab = FailureLab(session)
    await session.run(scenario="refund", preset="ledger", fault="crash_before_checkpoint", seed=0)
    first = db.dbname_of(h.url)
    await h.close()  # the notebook's last cell
    assert first not in db.list_databases()

    lab.choose(fault="provider_timeout", scenario="invoice", preset="ledger", seed=0)
    t0 = time.monotonic()
    lab.run_button.click()
    result = await lab.wait()
    try:
        assert lab.error is None and time.monotonic() - t0 < 10  # no pool timeout on the dropped database
        fresh = lab.reopened
        assert fresh is session.harness and fresh is not h and not fresh.closed
        name = db.dbname_of(fresh.url)
        assert name.startswith("agentlab_nb09_") and name != first and name in db.list_databases()
        assert f"opened a fresh one, {name}" in lab.status.value and "provider_timeout under ledger" in lab.status.value
        (customer,) = result.run.episode.customer_ids
        with psycopg.connect(fresh.url) as conn:  # what the tab shows is what the new database holds
            (charges,) = conn.execute("SELECT count(*) FROM provider.payments WHERE customer = %s AND kind = 'charge'",
                                      (customer_ref(customer),)).fetchone()
        assert charges == 2 and int(result.rows["provider_charges"].sum()) == 2
        assert f"{customer}" in lab.table_text("affected rows")
        assert len(session.results) == 2  # the chart keeps the episode run before the close

        lab.run_button.click()  # a second Run stays on the reopened database
        await lab.wait()
        assert lab.error is None and session.harness is fresh and "opened a fresh one" not in lab.status.value
    finally:
        await session.harness.close()
    assert name not in db.list_databases()


async def test_c29_plain_calls_on_a_closed_harness_fail_at_once_naming_the_database():
    h = await Harness.open(purpose="c29")
    name = db.dbname_of(h.url)
    await h.close()
    session = LabSession(h)
    t0 = time.monotonic()
    with pytest.raises(HarnessClosed) as info:
        await session.run(scenario="refund", preset="full")
    with pytest.raises(HarnessClosed):
        await h.run_episode("refund", "full")
    assert time.monotonic() - t0 < 1
    message = str(info.value)
    assert name in message and "await h.close()" in message and LOST not in message and "server" not in message


async def test_c29_a_database_dropped_under_a_running_harness_is_not_called_a_lost_server():
    h = await Harness.open(purpose="c29")
    name = db.dbname_of(h.url)
    try:
        db.drop_database(name)  # what `db reset` or another session does; the server keeps running
        with pytest.raises(db.DatabaseMissing) as info:
            await h.ensure_reachable()
        message = str(info.value)
        assert name in message and "no longer exists" in message and "server is running" in message
        assert LOST not in message and "db start" not in message
        assert isinstance(info.value, db.DatabaseUnavailable)  # the CLI's handler: one line, exit 2
    finally:
        await h.close()


async def test_c29_a_refused_connection_on_a_running_server_names_the_reason_not_a_lost_server(database_url):
    h = await Harness.open(database_url)
    try:
        with psycopg.connect(db.server_url(), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{db.dbname_of(database_url)}" ALLOW_CONNECTIONS false')
        with pytest.raises(db.DatabaseUnavailable) as info:
            await h.ensure_reachable()
        assert not isinstance(info.value, db.DatabaseMissing)
        message = str(info.value)
        assert "server is running" in message and "not currently accepting connections" in message
        assert LOST not in message
    finally:
        with psycopg.connect(db.server_url(), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{db.dbname_of(database_url)}" ALLOW_CONNECTIONS true')
        await h.close()


async def test_c29_a_stopped_server_is_still_called_a_lost_server(database_url):
    """The message for the real thing is unchanged; the server stopped is played by an address nothing
    listens on (the embedded server is shared by the whole test run)."""
    h = await Harness.open(database_url)
    try:
        h.url = db.with_dbname("postgresql://postgres@127.0.0.1:1/postgres", db.dbname_of(database_url))
        with pytest.raises(db.DatabaseUnavailable) as info:
            await h.ensure_reachable()
        assert not isinstance(info.value, db.DatabaseMissing)
        assert str(info.value).startswith(LOST) and "db start" in str(info.value)
    finally:
        h.url = database_url
        await h.close()
