"""A DBOS agent (DBOS Transact, as its documentation writes one) under the lab's faults, each life a real
process: what the database and the provider hold, what the kit's checker reports, and what DBOS says.

A crash here is a process that exits (``os._exit(99)``) right after the deduction committed and before DBOS
recorded the step; a new process recovers the workflow at ``DBOS.launch()``. The engine is an optional
install: without it this file skips, with the line that installs it."""

from __future__ import annotations

import pytest

pytest.importorskip("dbos", reason="DBOS Transact is an optional install: pip install -r requirements-engines.txt")

from agentlab.lab.clients.dbos_agent import sqlalchemy_url  # noqa: E402 (after the skip)
from agentlab.lab.engines import run_dbos_episode  # noqa: E402
from conftest import customer_state, fetch, scalar  # noqa: E402

OPENING_CREDIT_CENTS = 5000  # billing's refund story: one customer with 50.00 of store credit
REFUND_CENTS = 2500


async def held(h, customer_id: int) -> dict:
    """What the database and the provider hold for the episode's customer."""
    return await customer_state(h, customer_id)


def kinds(ep) -> dict[str, int]:
    return {k: n for k, n in ep.counts().items() if n}


async def test_a_fault_free_episode_passes_clean_and_dbos_says_success(harness):
    ep = await run_dbos_episode(harness, "none", shape="transactions")
    assert [life.returncode for life in ep.lives] == [0]
    assert ep.status == "SUCCESS"
    assert ep.violations == []
    assert await held(harness, ep.customer_ids[0]) == {
        "credit": OPENING_CREDIT_CENTS - REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert ep.versions["dbos"] != "-"
    assert ep.system_database.startswith("agentlab_dbos_")
    assert not await fetch(harness, "SELECT 1 FROM pg_database WHERE datname = %s", (ep.system_database,))  # dropped


@pytest.mark.slow
async def test_a_step_that_committed_and_died_runs_again_on_recovery_and_dbos_says_success(harness):
    ep = await run_dbos_episode(harness, "crash_inside_step", shape="steps")
    assert [life.returncode for life in ep.lives] == [99, 0]
    assert ep.status == "SUCCESS"  # the engine's verdict, beside a customer deducted twice
    assert await held(harness, ep.customer_ids[0]) == {
        "credit": OPENING_CREDIT_CENTS - 2 * REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert kinds(ep) == {"balance_mismatch": 1}
    assert await scalar(harness, "SELECT count(*) FROM lab_death_flags") == 0  # fired once, then disarmed


@pytest.mark.slow
async def test_a_datasource_transaction_that_committed_and_died_is_not_run_again(harness):
    ep = await run_dbos_episode(harness, "crash_inside_step", shape="transactions")
    assert [life.returncode for life in ep.lives] == [99, 0]
    assert ep.status == "SUCCESS"
    assert await held(harness, ep.customer_ids[0]) == {
        "credit": OPENING_CREDIT_CENTS - REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert ep.violations == []


async def test_the_models_resend_after_a_raw_error_is_new_work_to_dbos(harness):
    ep = await run_dbos_episode(harness, "refund_story", shape="transactions")
    assert [life.returncode for life in ep.lives] == [0]
    assert ep.status == "SUCCESS"
    state = await held(harness, ep.customer_ids[0])
    assert state["credit"] == OPENING_CREDIT_CENTS - 2 * REFUND_CENTS  # the resent batch deducted again
    assert (state["memos"], state["refunds"], state["paid_refunds"]) == (1, 1, 1)  # natural keys refused the rest
    found = kinds(ep)
    assert found["balance_mismatch"] == 1 and found["leak"] >= 1  # SQLAlchemy's error text shows the statement


async def test_an_unknown_fault_or_shape_is_refused_by_name(harness):
    with pytest.raises(ValueError, match="crash_inside_step"):
        await run_dbos_episode(harness, "no_such_fault")
    with pytest.raises(ValueError, match="transactions, steps"):
        await run_dbos_episode(harness, "none", shape="activities")


def test_a_conninfo_becomes_a_sqlalchemy_url_for_psycopg():
    assert sqlalchemy_url("host=127.0.0.1 port=5432 user=postgres dbname=agentlab_x") == (
        "postgresql+psycopg://postgres@127.0.0.1:5432/agentlab_x")
    assert sqlalchemy_url("postgresql://u:p%40ss@db/app") == "postgresql+psycopg://u:p%40ss@db/app"
    assert sqlalchemy_url("host=/tmp/pg port=5433 user=me dbname=d") == (
        "postgresql+psycopg://me@/d?host=%2Ftmp%2Fpg&port=5433")


async def test_a_fault_the_dbos_agent_cannot_take_is_not_applicable_with_its_reason(harness):
    from agentlab.lab.yardstick import Yardstick

    run = await Yardstick(harness).run("dbos:steps", "backend_killed")
    assert run.status == "n/a" and "measured under none, refund_story, crash_inside_step" in run.reason
    assert run.customer_ids == [] and "engine" not in run.notes  # no row written, no process started


@pytest.mark.slow
def test_the_command_line_puts_dbos_beside_the_kit_with_its_own_verdict():
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "agentlab", "chaos", "--agent", "kit", "dbos:steps", "--faults", "crash_inside_step",
           "--episodes", "1"]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)["summary"]
    assert summary == {"kit:full": {"crash_inside_step": 0}, "dbos:steps": {"crash_inside_step": 1}}
    text = subprocess.run([*cmd, "--no-progress"], capture_output=True, text=True, timeout=300, check=False).stdout
    assert "dbos:steps x crash_inside_step: SUCCESS" in text and "measured with dbos 3.4" in text
