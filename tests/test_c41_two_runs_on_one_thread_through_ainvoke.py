"""C41: two runs on one thread through the ordinary LangGraph call, with no kit entry point around them.

The graph is the one a user builds under ``full`` (``Harness.graph``, that is ``build_graph``) and it is
called exactly as LangGraph's documentation does: ``await graph.ainvoke({"messages": [...]},
{"configurable": {"thread_id": ...}})`` (plus the tenant the kit's isolation needs), no ``run_episode``, no
``invoke_with_lease``. One writer per thread must hold all the same: the compiled graph takes the thread's
lease for every run that does not carry one, so a second run while the first is alive is refused with
ThreadBusy before it reads or writes anything; the money moves once, the ledger holds the first run's calls
only and the thread keeps one chain of checkpoints.

The overlap is forced, not hoped for: the first run's model holds one of its calls until the second run
has ended, so the second always starts while the first holds the thread (between batches, its lease kept
alive by its heartbeat). A run whose process died leaves a lease nobody renews: the next plain call waits
for it to expire and runs (the resume after a crash still works).
"""

from __future__ import annotations

import asyncio

from langchain_core.messages import HumanMessage
from pydantic import PrivateAttr
from test_c18_two_runs_on_one_thread import CHAIN

from agentlab.core.messages import unanswered_tool_calls
from agentlab.core.run_lock import ThreadBusy, acquire_lease
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.durable.approval import (
    APPROVAL,
    ApprovalPolicy,
    interrupts_of,
    resume_command,
)
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

BOUND_S = 60  # far above a run of the story, far below a hang


class HeldModel(ScriptedChatModel):
    """The scripted model, held at its ``hold_at``-th call (1: the first) until :attr:`release` is set;
    :attr:`entered` is set when that call starts. Every other call answers at once."""

    hold_at: int = 1
    _calls: int = PrivateAttr(default=0)
    _entered: asyncio.Event = PrivateAttr(default_factory=asyncio.Event)
    _release: asyncio.Event = PrivateAttr(default_factory=asyncio.Event)

    @property
    def entered(self) -> asyncio.Event:
        return self._entered

    @property
    def release(self) -> asyncio.Event:
        return self._release

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        self._calls += 1
        if self._calls == self.hold_at:
            self._entered.set()
            await self._release.wait()
        return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)


def documented_config(thread: str, tenant_id: str) -> dict:
    """The config of LangGraph's documentation, with the tenant the kit's isolation requires."""
    return {"configurable": {"thread_id": thread, "tenant_id": tenant_id}}


async def while_the_first_holds(model: HeldModel, first, second) -> list:
    """Run ``first()``; once its model is inside the held call run ``second()``, then let the first go on.
    Returns both outcomes (a result or what was raised), first's first."""

    async def then_second():
        await model.entered.wait()
        try:
            return await second()
        finally:
            model.release.set()

    return await asyncio.wait_for(asyncio.gather(first(), then_second(), return_exceptions=True), BOUND_S)


async def thread_state(h, thread: str, customer: int) -> dict:
    """What the database holds for ``thread`` and ``customer`` (the outbox drained first)."""
    await h.worker.drain()
    return {
        "credit": await scalar(h, "SELECT credit_cents FROM customers WHERE id = %s", (customer,)),
        "memos": await scalar(h, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (customer,)),
        "refunds": await scalar(h, "SELECT count(*) FROM refunds WHERE customer_id = %s", (customer,)),
        "payments": await scalar(h, "SELECT count(*) FROM provider.payments WHERE customer = %s", (f"cus_{customer}",)),
        "ledger": await scalar(h, "SELECT count(*) FROM tool_executions WHERE thread_id = %s", (thread,)),
        "chain": (await fetch(h, CHAIN, {"t": thread}))[0],
        "leases": await scalar(h, "SELECT count(*) FROM runs.thread_leases WHERE thread_id = %s", (thread,)),
    }


async def refund_story(h, thread: str):
    """The refund story under ``full`` with a held model: (graph, model, inputs, config, customer id)."""
    sc = get_scenario("refund")
    ids = await h.create_customers(sc, preset("full"))
    model = HeldModel(script=sc.script(ids), seed=0)
    graph = h.graph(preset("full"), model)
    return graph, model, {"messages": [HumanMessage(sc.prompt)]}, documented_config(thread, sc.tenant_id), ids[0]


def assert_refused(outcome, thread: str) -> None:
    assert isinstance(outcome, ThreadBusy), outcome
    assert f"thread {thread!r} has a run in progress; this run was refused" in str(outcome)


def assert_applied_once(state: dict) -> None:
    assert (state["credit"], state["memos"], state["refunds"], state["payments"]) == (2500, 1, 1, 1)
    assert state["ledger"] == 3  # the first run's memo, deduction and refund; the second committed nothing
    checkpoints, roots, children = state["chain"]
    assert checkpoints > 1 and roots == 1 and children == 1  # one chain: every checkpoint has one child at most
    assert state["leases"] == 0  # released when the first run ended


async def test_c41_two_ainvokes_at_once_on_one_thread_deduct_once_and_the_second_is_refused(harness):
    thread = "c41-ainvoke"
    graph, model, inputs, config, customer = await refund_story(harness, thread)

    first, second = await while_the_first_holds(model, lambda: graph.ainvoke(inputs, config),
                                                lambda: graph.ainvoke(inputs, config))

    assert not isinstance(first, BaseException), first
    assert_refused(second, thread)
    assert sum(isinstance(m, HumanMessage) for m in first["messages"]) == 1  # one run's history, not interleaved
    assert_applied_once(await thread_state(harness, thread, customer))
    snapshot = await graph.aget_state(config)
    assert snapshot.values["messages"] == first["messages"] and snapshot.next == ()


async def test_c41_two_astreams_at_once_on_one_thread_deduct_once_and_the_second_is_refused(harness):
    thread = "c41-astream"
    graph, model, inputs, config, customer = await refund_story(harness, thread)

    async def stream() -> list:
        return [chunk async for chunk in graph.astream(inputs, config, stream_mode="updates")]

    first, second = await while_the_first_holds(model, stream, stream)

    assert not isinstance(first, BaseException), first
    assert "tools" in {node for chunk in first for node in chunk}
    assert_refused(second, thread)
    assert_applied_once(await thread_state(harness, thread, customer))


async def test_c41_a_fresh_ainvoke_while_a_command_resume_runs_is_refused_and_the_refunds_are_paid_once(harness):
    thread = "c41-resume"
    sg = preset("full")
    ids = await harness.create_customers(APPROVAL, sg)
    model = HeldModel(script=APPROVAL.script(ids), seed=0, hold_at=2)  # held after the approved batch committed
    graph = harness.graph(sg, model, approval=ApprovalPolicy())
    config = documented_config(thread, APPROVAL.tenant_id)
    stopped = await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config)
    (request,) = interrupts_of(stopped)
    assert await scalar(harness, "SELECT count(*) FROM runs.thread_leases") == 0  # the interrupted run let go

    resumed, fresh = await while_the_first_holds(
        model, lambda: graph.ainvoke(resume_command("approve"), config),
        lambda: graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config))

    assert not isinstance(resumed, BaseException), resumed
    assert_refused(fresh, thread)
    assert sum(isinstance(m, HumanMessage) for m in resumed["messages"]) == 1  # the fresh prompt never landed
    await harness.worker.drain()
    refunds = await fetch(harness, "SELECT reference FROM refunds WHERE customer_id = %s ORDER BY reference", (ids[0],))
    assert refunds == [("RMA-3001",), ("RMA-3002",)]
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = %s", (f"cus_{ids[0]}",)) == 2
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = %s", (thread,)) == 2
    assert await fetch(harness, "SELECT status FROM approval_requests WHERE request_key = %s",
                       (request["request_key"],)) == [("decided",)]
    _checkpoints, roots, children = (await fetch(harness, CHAIN, {"t": thread}))[0]
    assert roots == 1 and children == 1
    assert await scalar(harness, "SELECT count(*) FROM runs.thread_leases") == 0


async def test_c41_a_plain_call_waits_out_the_lease_of_a_run_that_died_and_runs(harness):
    thread = "c41-dead-holder"
    graph, model, inputs, config, customer = await refund_story(harness, thread)
    model.release.set()  # nothing to hold here
    # a run that died holding the thread: its lease row stays, and nobody renews it any more
    dead = await acquire_lease(harness.pool, thread, ttl_ms=400)

    state = await asyncio.wait_for(graph.ainvoke(inputs, config), BOUND_S)

    assert unanswered_tool_calls(state["messages"]) == []
    assert_applied_once(await thread_state(harness, thread, customer))
    assert dead.owner_token not in {r for r, in await fetch(harness, "SELECT owner_token FROM runs.thread_leases")}
