"""The failure lab's plain calls (agentlab.lab.session) and the ladder's reading (agentlab.lab.ladder), on real
databases: every frame is compared with what the database, the provider and the messages hold."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest

from agentlab.lab.experiments import run_experiment
from agentlab.lab.ladder import by_group, ladder_chart, rung_table
from agentlab.lab.session import (
    LEDGER_COUNT_COLUMNS,
    ROLLBACK_COLUMNS,
    TOOL_MESSAGE_COLUMNS,
    LabSession,
    lab_charts,
    lab_run,
    ledger_chart,
    rollback_rate_chart,
    rollback_rates,
)
from conftest import fetch, scalar

REFUND_TOOLS = ["ApplyCredit", "CreateCreditMemo", "QueueRefund"]


async def test_a_crash_after_the_commit_under_ledger_reads_back_as_three_replays(harness):
    r = await lab_run(harness, scenario="refund", preset="ledger", fault="crash_before_checkpoint", seed=0)
    assert r.run.crashed and r.ok and r.batches == 1 and r.rolled_back == 0
    assert list(r.tool_messages.columns) == list(TOOL_MESSAGE_COLUMNS)
    assert list(r.tool_messages["outcome"]) == ["replayed"] * 3
    # the ledger frame is the thread's ledger, in the order the model sent the calls
    stored = await fetch(harness, "SELECT tool_call_id, tool_name FROM tool_executions WHERE thread_id = %s",
                         (r.thread_id,))
    assert sorted(map(tuple, r.ledger[["tool_call_id", "tool"]].values)) == sorted(stored)
    assert list(r.ledger["tool"]) == list(r.tool_messages["tool"])
    replays = await scalar(harness, "SELECT count(*) FROM events WHERE thread_id = %s AND outcome = 'replayed'",
                           (r.thread_id,))
    assert replays == 3
    assert list(r.ledger_counts.columns) == list(LEDGER_COUNT_COLUMNS)
    assert r.ledger_counts.to_dict("records") == [{"tool": t, "applied": 1, "replayed": 1} for t in REFUND_TOOLS]
    (customer,) = r.run.episode.customer_ids
    row = r.rows.iloc[0].to_dict()
    assert row["customer_id"] == customer
    assert row["credit_cents"] == await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (customer,))
    assert (row["credit_memos"], row["refunds"], row["provider_refunds"], row["provider_charges"]) == (1, 1, 1, 0)
    assert len(r.outbox) == 0  # `ledger` calls the provider inline


async def test_the_same_crash_under_savepoints_is_three_rolled_back_batches_and_unreported_effects(harness):
    r = await lab_run(harness, scenario="refund", preset="savepoints", fault="crash_before_checkpoint", seed=0)
    assert list(r.rollbacks.columns) == list(ROLLBACK_COLUMNS)
    assert r.rollbacks[["failed", "not_applied", "rolled_back"]].values.tolist() == [[1, 2, True]] * 3
    assert r.rolled_back == r.run.episode.rollbacks_total == 3  # the lab's reading and the graph's counter agree
    assert r.run.episode.escalated
    assert set(r.violations["kind"]) == {"leak", "unreported_effect"}
    assert len(r.ledger) == 0 and r.ledger_counts.empty
    # the work was done once although the model was told three times it was not
    assert r.rows.loc[0, ["credit_memos", "refunds", "provider_refunds"]].tolist() == [1, 1, 1]
    assert "savepoints (refund, seed 0): 3 batch(es), 3 rolled back, escalated" in r.headline()


async def test_a_commit_turned_into_rollback_counts_as_a_rolled_back_batch(harness):
    """Without savepoints the model is told "applied" for calls PostgreSQL then rolls back (case C09): the
    rollbacks frame reads that from the node's events, and agrees with the graph's counter."""
    r = await lab_run(harness, scenario="refund", preset="transaction", fault="check_violation", seed=0)
    first = r.rollbacks.iloc[0]
    assert first["applied"] > 0 and first["failed"] == 1 and first["rolled_back"]
    assert await scalar(harness, "SELECT count(*) FROM events WHERE thread_id = %s AND outcome = 'commit_rolled_back'",
                        (r.thread_id,)) == 1
    assert r.rolled_back == r.run.episode.rollbacks_total == 1


async def test_under_full_the_charge_is_an_outbox_row_dispatched_once(harness):
    r = await lab_run(harness, scenario="invoice", preset="full", fault="provider_timeout", seed=0)
    assert r.ok
    assert r.outbox.to_dict("records") == [{"topic": "payment.charge",
                                            "dedupe_key": f"charge:{r.run.episode.customer_ids[0]}:2026-03-01",
                                            "status": "dispatched", "attempts": 2}]
    assert int(r.rows["provider_charges"].sum()) == 1
    under_ledger = await lab_run(harness, scenario="invoice", preset="ledger", fault="provider_timeout", seed=0)
    assert int(under_ledger.rows["provider_charges"].sum()) == 2
    assert list(under_ledger.violations["kind"]) == ["payment_count"]


async def test_a_scenario_the_fault_does_not_fit_is_refused_before_any_row_is_written(harness):
    before = await scalar(harness, "SELECT count(*) FROM customers")
    with pytest.raises(ValueError, match="fits the scenarios reorder"):
        await lab_run(harness, scenario="refund", fault="wrong_order")
    with pytest.raises(ValueError, match="unknown preset"):
        await lab_run(harness, preset="careful", fault="none")
    with pytest.raises(ValueError, match="unknown fault"):
        await LabSession(harness).run(fault="meteor")
    assert await scalar(harness, "SELECT count(*) FROM customers") == before


async def test_a_session_keeps_every_episode_and_its_rollback_rate(harness):
    session = LabSession(harness)
    last = await session.run(preset="validated", fault="backend_killed", seed=0, episodes=3)
    await session.run(preset="transaction", fault="backend_killed", seed=0, episodes=2)
    history = session.history()
    assert list(history["episode"]) == [1, 2, 3, 4, 5]
    assert list(history["seed"]) == [0, 1, 2, 0, 1]
    assert last is session.results[2]
    assert list(history["rollbacks"]) == [r.rolled_back for r in session.results]
    assert list(history["rollbacks"]) == [r.run.episode.rollbacks_total for r in session.results]
    rates = rollback_rates(history)
    validated = rates[rates["series"] == "backend_killed · validated"]
    batches = history["batches"][:3].cumsum()
    rolled = history["rollbacks"][:3].cumsum()
    assert validated["rate_pct"].round(6).tolist() == (100 * rolled / batches).round(6).tolist()
    assert rates[rates["series"] == "backend_killed · transaction"]["rate_pct"].tolist() == [0.0, 0.0]
    threads = [r.thread_id for r in session.results]
    ledger_rows = await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = ANY(%s)", (threads,))
    assert ledger_rows == 0  # neither preset has a ledger
    session.clear()
    assert session.history().empty and session.last is None


async def test_the_charts_plot_the_numbers_read_back(harness):
    session = LabSession(harness)
    await session.run(scenario="refund", preset="ledger", fault="crash_before_checkpoint", seed=0, episodes=2)
    counts = session.ledger_counts()
    assert counts.to_dict("records") == [{"tool": t, "applied": 2, "replayed": 2} for t in REFUND_TOOLS]
    fig = ledger_chart(counts)
    ax = fig.axes[0]
    assert [round(p.get_height()) for p in ax.patches] == [2, 2, 2, 2, 2, 2]
    assert ax.get_ylabel() == "tool calls (count)"
    fig = rollback_rate_chart(session.history())
    ax = fig.axes[0]
    assert ax.get_ylabel() == "rolled-back batches (% of batches)" and "count" in ax.get_xlabel()
    assert [list(line.get_ydata()) for line in ax.get_lines()] == [[0.0, 0.0]]
    fig = lab_charts(session)
    assert len(fig.axes) == 2 and fig.axes[1].get_title() == "Ledger of the last episode (ledger)"
    empty = ledger_chart(pd.DataFrame(columns=list(LEDGER_COUNT_COLUMNS)))
    assert "the ledger is empty" in empty.axes[0].texts[-1].get_text()
    matplotlib.pyplot.close("all")


async def test_the_rung_table_reads_the_ladder_from_an_experiment(harness):
    faults = ["wrong_type", "crash_before_checkpoint", "provider_timeout", "wrong_order"]
    result = await run_experiment(1, faults=faults, seed=0, url=harness.url, progress=False)
    rungs = rung_table(result)
    assert list(rungs.index) == list(result.presets)
    assert rungs["violations"].tolist() == result.summary.sum().tolist()
    assert rungs.loc["full", "violations"] == 0
    assert rungs.loc["validated", "faults_held_from_here"] == "wrong_type"
    assert rungs.loc["savepoints", "faults_held_from_here"] == "wrong_order"
    assert rungs.loc["ledger", "faults_held_from_here"] == "crash_before_checkpoint"
    assert rungs.loc["full", "faults_held_from_here"] == "provider_timeout"
    effects = result.safeguard_effects()
    assert rungs["cells_fixed"].tolist() == [int((effects["safeguard"] == p).sum()) for p in result.presets]
    groups = by_group(result)
    assert groups.sum(axis=1).tolist() == result.summary.sum().tolist()
    fig = ladder_chart(result)
    assert fig.axes[0].get_ylabel() == "invariant violations (count)"
    matplotlib.pyplot.close("all")
