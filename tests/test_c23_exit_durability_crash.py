"""C23: durability="exit" and a process killed (SIGKILL) right after a batch commits.

The kill is real: a child process runs the refund story and kills itself after the tools node's
COMMIT, so LangGraph never writes the run's one checkpoint. The parent then finds no checkpoint
(``resume_thread`` says so, with the ledger's count) and re-submits the prompt with a model that mints
other tool call ids: natural keys refuse a second credit memo and refund, the atomic policy rolls
ApplyCredit back with them, and the provider pays once. Where no natural key exists (ApplyCredit
alone, or under the partial policy) the deduction applies again: the test states that gap too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from langchain_core.messages import HumanMessage

from agentlab.core.graph import build_graph, run_config
from agentlab.core.safeguards import preset
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.durable.history import NoCheckpoint, resume_thread
from agentlab.lab.batches import new_customer, tool_calls
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

CHILD = textwrap.dedent("""
    import asyncio, os, signal, sys
    from langchain_core.messages import HumanMessage
    from agentlab.core.graph import build_graph, run_config
    from agentlab.core.safeguards import preset
    from agentlab.domains.billing.scenarios import get_scenario
    from agentlab.runtime.harness import Harness
    from agentlab.sim.model import ScriptedChatModel

    async def main(url, thread):
        h = await Harness.open(url)
        sc, sg = get_scenario("refund"), preset("full")
        ids = await h.create_customers(sc, sg)
        print(ids[0], flush=True)
        node = h.node(sg)
        node.hooks.after_commit.append(lambda calls: os.kill(os.getpid(), signal.SIGKILL))  # dies after COMMIT
        graph = build_graph(ScriptedChatModel(script=sc.script(ids), seed=0), node, checkpointer=h.saver)
        await graph.ainvoke({"messages": [HumanMessage(sc.prompt)]}, run_config(thread, tenant_id=sc.tenant_id),
                            durability="exit")

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


async def test_c23_a_kill_under_exit_leaves_no_checkpoint_and_the_resubmission_applies_nothing_twice(
        harness, database_url, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    thread = "c23-exit"
    proc = subprocess.run([sys.executable, str(script), database_url, thread], capture_output=True, text=True,
                          timeout=120, env={**os.environ})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    customer = int(proc.stdout.split()[0])

    # the batch committed, the checkpoint was never written
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = %s", (thread,)) == 3
    assert await scalar(harness, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread,)) == 0
    assert await fetch(harness, "SELECT credit_cents FROM customers WHERE id = %s", (customer,)) == [(2500,)]

    sc, sg = get_scenario("refund"), preset("full")
    ids = [customer]
    config = run_config(thread, tenant_id=sc.tenant_id)
    graph = build_graph(ScriptedChatModel(script=sc.script(ids), seed=1), harness.node(sg), checkpointer=harness.saver)
    with pytest.raises(NoCheckpoint, match=r"has no checkpoint to resume .* 3 of its tool calls committed"):
        await resume_thread(graph, config, pool=harness.pool)

    state = await graph.ainvoke({"messages": [HumanMessage(sc.prompt)]}, config)  # the prompt again, new ids
    await harness.worker.drain()
    assert await fetch(harness, "SELECT credit_cents FROM customers WHERE id = %s", (customer,)) == [(2500,)]
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (customer,)) == 1
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (customer,)) == 1
    assert await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = %s", (f"cus_{customer}",)) == 1
    replies = [m.content for m in state["messages"] if getattr(m, "type", "") == "tool"]
    assert any(r.startswith("FAILED [conflict]: a credit memo with this reference already exists") for r in replies)


async def test_c23_natural_keys_refuse_the_committed_calls_and_applycredit_has_none(harness):
    customer = await new_customer(harness, 5000, preset="full")
    batch = [("CreateCreditMemo", {"customer_id": customer, "reference": "RMA-7", "amount_cents": 2500}),
             ("ApplyCredit", {"customer_id": customer, "amount_cents": 2500}),
             ("QueueRefund", {"customer_id": customer, "reference": "RMA-7", "amount_cents": 2500})]
    partial = preset("full").replace(policy="partial", name="full-partial")
    first = await harness.node(partial).run_batch(tool_calls(*batch, prefix="first"), tenant_id="acme", thread_id="t1")
    assert [r.outcome.value for r in first.results] == ["applied"] * 3
    # the same batch re-submitted on a thread with no history: other ids, so the ledger cannot help
    again = await harness.node(partial).run_batch(tool_calls(*batch, prefix="again"), tenant_id="acme", thread_id="t2")
    assert [(r.outcome.value, r.category) for r in again.results] == [
        ("failed", "conflict"), ("applied", None), ("failed", "conflict")]
    await harness.worker.drain()
    assert await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (customer,)) == 1
    assert await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (customer,)) == 1
    assert await scalar(harness, "SELECT count(*) FROM provider.payments") == 1
    # where no natural key exists, nothing stops the second deduction: said plainly, and held by this line
    assert await fetch(harness, "SELECT credit_cents FROM customers WHERE id = %s", (customer,)) == [(0,)]
