"""A tool-call budget kept in graph state lets two runs at once and a crash-and-resume through; the kit's,
kept in the database, does not (:mod:`agentlab.lab.budgets`, counts read from the ledger)."""

from __future__ import annotations

from agentlab.lab.budgets import CRASH_AND_RESUME, DATABASE, GRAPH_STATE, TWO_RUNS, compare_budgets
from conftest import fetch


async def test_a_state_budget_doubles_under_two_runs_and_a_crash_while_the_database_budget_holds(harness):
    figures = await compare_budgets(harness, limit=3)

    assert figures == {TWO_RUNS: {"limit": 3, GRAPH_STATE: 6, DATABASE: 3},
                       CRASH_AND_RESUME: {"limit": 3, GRAPH_STATE: 6, DATABASE: 3}}
    counters = await fetch(harness, "SELECT used, limit_calls FROM runs.call_budgets ORDER BY scope_id")
    assert counters == [(3, 3), (3, 3)]  # one per database-budget thread, at its limit
