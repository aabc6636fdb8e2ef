"""The lab's one loop (:mod:`agentlab.lab.loop`) plays the kit's graph (``Lab.run``, the kit client) and any
LangGraph agent (``Yardstick.run``, the graph-agent client) alike: a fault that lives in the code (``rearms``)
is armed again in the restarted process whoever the agent is, so a nemesis without its once-only guard kills
the resumed run too, and one with the guard lets it finish, with the same end state for both clients."""

from __future__ import annotations

import dataclasses

import pytest

from agentlab.lab.faults import Fault
from agentlab.lab.runner import Lab
from agentlab.lab.yardstick import Yardstick
from agentlab.lab.yardstick_faults import YardstickFault


@dataclasses.dataclass(frozen=True)
class CrashAfterThirdCall(Fault):
    """A crash in the code, after the batch's third call and before its COMMIT (``guarded``: only once)."""

    guarded: bool = True
    resumes = True
    rearms = True

    async def arm(self, run) -> None:
        async def die(call, index: int) -> None:
            if index == 2 and not (self.guarded and run.notes.get("crashes")):
                raise run.crash("after the batch's third call")

        run.node.hooks.after_call.append(die)


def crash(guarded: bool) -> CrashAfterThirdCall:
    return CrashAfterThirdCall("crash_after_third_call", "crash_mid_node", "dies after the third call", "ledger",
                               guarded=guarded)


async def both_clients(harness, guarded: bool):
    """The refund story, seed 0, under ``full``: through the kit client and through the graph-agent client."""
    async with Lab(harness) as lab:
        kit = await lab.run(crash(guarded), "full", scenario="refund", seed=0)
    agent = await Yardstick(harness).run("kit:full", YardstickFault(crash(guarded), needs=frozenset({"node_hooks"})),
                                         scenario="refund", seed=0)
    return kit, agent


@pytest.mark.asyncio
async def test_a_nemesis_without_its_guard_kills_the_resumed_run_of_either_client(harness):
    kit, agent = await both_clients(harness, guarded=False)
    assert kit.crashed and agent.crashed
    assert kit.notes["crashed_again"] is True and agent.notes["crashed_again"] is True
    assert len(kit.notes["crashes"]) == len(agent.notes["crashes"]) == 2
    assert kit.episode.error.startswith("SimulatedCrash") and agent.raised.startswith("SimulatedCrash")


@pytest.mark.asyncio
async def test_a_guarded_nemesis_crashes_once_and_both_clients_end_clean(harness):
    kit, agent = await both_clients(harness, guarded=True)
    assert kit.crashed and agent.crashed
    assert "crashed_again" not in kit.notes and "crashed_again" not in agent.notes
    assert kit.notes["crashes"] == agent.notes["crashes"] == ["after the batch's third call"]
    assert kit.violations == [] and agent.violations == []
    assert kit.episode.error is None and agent.raised is None
