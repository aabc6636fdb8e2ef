"""``run_yardstick(episodes_at_once=N)`` runs a cell's episodes at the same time (the engines' bench does, so their
retry timers and the stuck run's cap overlap) and gives the table one episode after another gives: same seeds,
same rows, same violations by kind; only the costs differ, and the fault-free cells keep counting round trips
per episode."""

from __future__ import annotations

import pytest

from agentlab.lab.yardstick_table import run_yardstick
from conftest import engine_installed

AGENTS = ("toolnode", "kit:full")
FAULTS = ("refund_story", "crash_mid_node", "backend_killed")  # a resend, a crash and resume, a killed backend
ENGINES = ("dbos:transactions", "temporal:activities")
ENGINE_FAULTS = ("none", "refund_story", "crash_inside_step")


@pytest.mark.slow
async def test_the_same_table_one_after_another_and_two_at_once(database_url):
    one = await run_yardstick(AGENTS, FAULTS, episodes=2, url=database_url, progress=False)
    two = await run_yardstick(AGENTS, FAULTS, episodes=2, url=database_url, progress=False, episodes_at_once=2)
    assert len(two.rows) == len(AGENTS) * len(FAULTS) * 2
    assert one.deterministic_view().equals(two.deterministic_view())
    assert two.summary.loc["refund_story", "toolnode"] > 0 and (two.summary["kit:full"] == 0).all()


async def test_with_costs_the_fault_free_cells_still_count_each_episodes_own_round_trips(database_url):
    result = await run_yardstick(AGENTS, ("none", "refund_story"), episodes=2, url=database_url, progress=False,
                                 costs=True, episodes_at_once=2)
    rows = result.rows
    alone, at_once = rows[rows["fault"] == "none"], rows[rows["fault"] == "refund_story"]
    assert len(alone) == len(at_once) == 4
    assert (alone["round_trips_per_call"] > 0).all()  # counted: they ran one at a time
    assert at_once["round_trips_per_call"].isna().all()  # not counted: theirs would be mixed with the others'
    assert (at_once["wall_ms_per_call"] > 0).all()


@pytest.mark.parametrize("at_once", [0, -1])
async def test_episodes_at_once_below_one_is_refused_before_anything_runs(at_once):
    with pytest.raises(ValueError, match=f"episodes_at_once must be at least 1, got {at_once}"):
        await run_yardstick(AGENTS, ("none",), episodes_at_once=at_once)


@pytest.mark.slow
@pytest.mark.skipif(not engine_installed("dbos", "temporalio"),
                    reason="the engines are an optional install: pip install -r requirements-engines.txt")
async def test_the_engines_give_the_same_table_with_their_episodes_at_once(database_url):
    """Each episode's engine state is its own (DBOS's system database, Temporal's task queue, the death flag):
    the crash that kills one episode's process kills no other, and each recovers its own run."""
    one = await run_yardstick(ENGINES, ENGINE_FAULTS, episodes=2, url=database_url, progress=False)
    two = await run_yardstick(ENGINES, ENGINE_FAULTS, episodes=2, url=database_url, progress=False,
                              episodes_at_once=2)
    assert one.deterministic_view().equals(two.deterministic_view())
    assert two.summary.loc["crash_inside_step", "temporal:activities"] > 0
