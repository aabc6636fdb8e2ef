"""Pydantic AI's durable agent on DBOS (an ``Agent`` with ``capabilities=[DBOSDurability()]`` inside a
``@DBOS.workflow``, its function tools made ``@DBOS.step`` functions, as its docs write one) under the lab's
faults, each life a real process: what the database and the provider hold, what the kit's checker reports, and
what DBOS says.

A crash here is a process that exits (``os._exit(99)``) right after the deduction committed and before DBOS
recorded the step; a new process recovers the workflow at ``DBOS.launch()``. Pydantic AI runs one response's
tool calls in parallel by default, so the refund's step is in flight beside the deduction when the process
dies: whether it had committed, and paid, is a race, and the tests assert only what every run showed.
Pydantic AI is an optional install: without it this file skips, with the line that installs it."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic_ai", reason="Pydantic AI is an optional install: pip install -r requirements-engines.txt")

from conftest import engine_episode, fetch, kinds  # noqa: E402

OPENING_CREDIT_CENTS = 5000  # billing's refund story: one customer with 50.00 of store credit
REFUND_CENTS = 2500


async def play(harness, fault: str):
    return await engine_episode(harness, "pydantic_ai:dbos", fault)


async def test_a_fault_free_episode_passes_clean_and_dbos_says_success(harness):
    run, engine, state = await play(harness, "none")
    assert [life[1] for life in engine["lives"]] == [0]
    assert engine["status"] == "SUCCESS" and run.raised is None
    assert run.violations == []
    assert state == {"credit": OPENING_CREDIT_CENTS - REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert engine["versions"]["pydantic-ai-slim"] != "-" and engine["versions"]["dbos"] != "-"
    assert not await fetch(harness, "SELECT 1 FROM pg_database WHERE datname = %s", (engine["system_database"],))


@pytest.mark.slow
async def test_a_step_that_committed_and_died_runs_again_on_recovery_unless_its_parallel_siblings_end_the_run(harness):
    run, engine, state = await play(harness, "crash_inside_step")
    assert [life[1] for life in engine["lives"]] == [99, 0]
    assert (state["memos"], state["refunds"]) == (1, 1)
    assert run.violations, "a crash inside a step is never clean for this agent"
    if state["credit"] == OPENING_CREDIT_CENTS - 2 * REFUND_CENTS:  # the deduction ran again on recovery (most runs)
        assert kinds(run)["balance_mismatch"] == 1
        # the race with the refund's parallel step: SUCCESS when it was recorded before the death, else ERROR
        # after its re-run met refunds_one_per_reference, the model resent and the retries ran out
        assert engine["status"] in ("SUCCESS", "ERROR") and state["paid_refunds"] in (0, 1)
    else:
        # on recovery the memo's and the refund's re-runs met their natural keys first, their retries ran out and
        # the run ended (ERROR) with the deduction's step cancelled before its UPDATE: deducted once, and the
        # deduction's call never answered
        assert state["credit"] == OPENING_CREDIT_CENTS - REFUND_CENTS
        assert engine["status"] == "ERROR" and kinds(run)["unanswered_call"] >= 1


@pytest.mark.slow
async def test_a_malformed_argument_never_reaches_the_database_but_the_resent_batch_does(harness):
    run, engine, state = await play(harness, "refund_story")
    assert [life[1] for life in engine["lives"]] == [0]
    # "12'" fails the tool's signature (a retry for the model, no SQL); the model resends the whole batch:
    # the memo is refused, the deduction runs again, the refund runs; the model resends again, and the memo's
    # second ModelRetry exceeds the tool's default of 1 retry: the run raises and DBOS says ERROR
    assert engine["status"] == "ERROR" and run.raised == "DBOS ERROR"
    assert state == {"credit": OPENING_CREDIT_CENTS - 2 * REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert kinds(run) == {"balance_mismatch": 1, "leak": 3, "unanswered_call": 1}  # SQL text in 3 ModelRetry's


def test_an_unknown_pydantic_ai_shape_is_refused_naming_the_shapes():
    from agentlab.core.errors import AgentlabError
    from agentlab.lab.agents import resolve_agent

    assert resolve_agent("pydantic_ai:dbos").engine == "pydantic_ai"
    assert resolve_agent("pydantic_ai:temporal").engine == "pydantic_ai_temporal"
    with pytest.raises(AgentlabError, match="pydantic_ai:dbos or pydantic_ai:temporal"):
        resolve_agent("pydantic_ai:prefect")
