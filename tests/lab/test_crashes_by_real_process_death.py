"""Crashes by real process death (``crash_inside_step``, :mod:`agentlab.lab.nemesis.death`): every life of the
agent is a child process; the one that reaches the tools step's record dies by ``os._exit`` after the step
committed, and a new process resumes the thread. The kit's ``full`` holds with its checkpoint per super-step
(``sync`` or ``async``); the prebuilt ``ToolNode`` deducts the refund twice; under ``exit`` there is no
checkpoint to resume, the user sends the prompt again and the deduction, which has no natural key, applies
twice even for the kit (the gap case C23 states). Values are read from the database and the provider."""

from __future__ import annotations

import os

import psycopg
import pytest

from agentlab.lab.nemesis.death import ARM, CRASH_INSIDE_STEP, EXIT_CODE, claim
from agentlab.lab.yardstick import Yardstick
from conftest import customer_state, scalar

OPENING_CENTS = 5000  # the refund story's customer; the refund is 2500


async def end_state(h, run) -> dict:
    (cid,) = run.customer_ids
    return await customer_state(h, cid)


def died_for_real(run) -> bool:
    """The first life exited with the nemesis's status and its process is gone."""
    pid = run.notes["death"]["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        gone = True
    else:
        gone = False
    return gone and run.notes["exit_codes"][0] == EXIT_CODE


@pytest.mark.parametrize("durability", ["sync", "async"])
@pytest.mark.slow
async def test_the_kits_full_holds_when_its_process_really_dies(harness, durability):
    run = await Yardstick(harness).run("kit:full", "crash_inside_step", scenario="refund", durability=durability)
    assert run.status == "ran" and run.crashed and died_for_real(run)
    assert run.notes["exit_codes"] == [EXIT_CODE, 0]
    assert await end_state(harness, run) == {"credit": OPENING_CENTS - 2500, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert run.raised is None and run.violations == []


async def test_the_prebuilt_toolnode_deducts_twice_when_its_process_really_dies(harness):
    run = await Yardstick(harness).run("toolnode", "crash_inside_step", scenario="refund")
    assert run.crashed and died_for_real(run)
    assert await end_state(harness, run) == {"credit": 0, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert run.raised == "UniqueViolation (23505)"  # the resumed step resends the credit memo
    assert run.counts()["balance_mismatch"] == 1


@pytest.mark.slow
async def test_under_exit_durability_the_resent_prompt_deducts_again_even_for_the_kit(harness):
    run = await Yardstick(harness).run("kit:full", "crash_inside_step", scenario="refund", durability="exit")
    assert run.crashed and died_for_real(run)
    assert run.notes["resume"] == "no checkpoint; the prompt was sent again"
    assert run.notes["exit_codes"] == [EXIT_CODE, 0, 0]  # died; found no checkpoint; the prompt again
    # the natural keys refuse a second memo and refund (paid once); the deduction has none: applied twice
    assert await end_state(harness, run) == {"credit": 0, "memos": 1, "refunds": 1, "paid_refunds": 1}
    assert run.counts()["balance_mismatch"] == 1


async def test_a_death_flag_fires_once_across_processes(harness):
    await CRASH_INSIDE_STEP.install(harness.pool)
    async with harness.pool.connection() as conn:
        await conn.execute(ARM, ("t-1:crash_inside_step",))
    claims = []
    for _ in range(2):  # two processes' connections reach the point in turn
        async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as conn:
            claims.append(await claim(conn, "t-1:crash_inside_step"))
    async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as conn:
        claims.append(await claim(conn, "never-armed"))
    assert claims == [True, False, False]
    assert await scalar(harness, "SELECT fired_pid FROM lab_death_flags WHERE name = 't-1:crash_inside_step'") \
        is not None


async def test_an_agent_a_child_process_cannot_rebuild_is_not_applicable(harness):
    from agentlab.lab.agents import AgentSpec, resolve_agent

    spec = resolve_agent("toolnode")
    unnamed = AgentSpec("my_agent", spec.build, tool_names=spec.tool_names)
    run = await Yardstick(harness).run(unnamed, "crash_inside_step", scenario="refund")
    assert run.status == "n/a" and "rebuilds the agent from its name" in run.reason
    assert run.customer_ids == [] and run.notes == {}  # nothing was created, no process started



def run_cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "agentlab", "chaos", *args], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.slow
def test_the_command_line_runs_the_real_crash_per_agent_and_durability():
    import json

    out = run_cli("--agent", "toolnode", "kit", "--faults", "crash_inside_step", "--durability", "async",
                  "--episodes", "1", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)["summary"]
    assert summary["kit:full"] == {"crash_inside_step": 0}
    assert summary["toolnode"]["crash_inside_step"] > 0


def test_the_real_crash_without_agents_is_a_usage_error_naming_the_fix():
    out = run_cli("--faults", "crash_inside_step", "--episodes", "1")
    assert out.returncode == 2 and "add --agent" in out.stderr and out.stdout == ""
