"""C46: the database server restarts in the middle of a run, and the caller goes on.

The refund story under ``full``; before call index 1 of its batch the server is restarted (``pg_ctl restart``,
``-m fast`` and ``-m immediate``). The run whose batch commits must not end in an exception, every tool call
id is answered, the next user message and the first drain after the restart work, and the end state is the
story's: credit 2,500, one credit memo, one refund paid once at the provider.

Runs on a private embedded server (its own ``AGENTLAB_HOME``), since the tests restart it; never the one the
other tests share.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage

from agentlab import build_graph, preset, run_config, run_experiment
from agentlab.core.messages import unanswered_tool_calls
from agentlab.runtime import db
from agentlab.runtime.harness import Episode, Harness
from agentlab.sim.model import ScriptedChatModel

STARTED_AT = "SELECT pg_postmaster_start_time()"
WAITS_ON = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)))"
POLL_S = 0.02
WAIT_CAP_S = 30.0


@pytest.fixture(scope="module")
def private_server():
    """An embedded server of this module's own, the one ``db`` and every harness here use while it runs."""
    home = Path(f"/tmp/agentlab-c46-{os.getpid()}-{time.time_ns()}")  # no spaces; readable by the server's user
    home.mkdir(mode=0o755)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv(db.ENV_VAR, raising=False)
            mp.setenv("AGENTLAB_HOME", str(home))
            mp.setattr("agentlab.runtime.server._server", None)  # the process's cached server, in its home
            db.server()  # initdb and start, in the private folder
            try:
                yield home
            finally:
                db.stop_embedded()
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
async def h(private_server):
    async with await Harness.open(purpose="c46") as harness:
        yield harness


async def started_at(h: Harness):
    async with h.pool.connection() as conn:
        return (await (await conn.execute(STARTED_AT)).fetchone())[0]


def refund_story(h: Harness, ids: list[int]):
    scenario = h.scenario("refund")
    return scenario, ScriptedChatModel(script=scenario.script(ids), seed=0)


async def play(h: Harness, graph, thread: str, text: str, tenant: str, durability: str = "async"):
    """One user message on ``thread``; returns the state after the run (raises what the run raises)."""
    return await graph.ainvoke({"messages": [HumanMessage(text)]}, run_config(thread, tenant_id=tenant),
                               durability=durability)


async def story_state(h: Harness, thread: str, ids: list[int]) -> dict:
    sc = h.scenario("refund")
    state = await h.end_state(Episode("refund", "full", thread, 0, ids, "public", sc.tenant_id))
    return {k: state["customers"][0][k] for k in ("final_credit_cents", "credit_memos", "refunds", "provider_refunds")}


STORY_END = {"final_credit_cents": 2500, "credit_memos": 1, "refunds": 1, "provider_refunds": 1}


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_c46_the_refund_story_goes_on_after_a_restart_at_call_index_1(h, mode):
    sg = preset("full")
    scenario = h.scenario("refund")
    ids = await h.create_customers(scenario, sg)
    _, model = refund_story(h, ids)
    node = h.node(sg)
    restarts: list[float] = []

    async def restart_before_call_1(call, index: int) -> None:
        if index == 1 and not restarts:
            restarts.append(await h.restart_server(mode))

    node.hooks.before_call.append(restart_before_call_1)
    graph = build_graph(model, node, checkpointer=h.saver)
    before = await started_at(h)
    thread = h.thread("c46")

    state = await play(h, graph, thread, scenario.prompt, scenario.tenant_id)  # raises nothing

    assert restarts and await started_at(h) > before  # the server really restarted, mid-batch
    snapshot = await graph.aget_state(run_config(thread, tenant_id=scenario.tenant_id))
    assert snapshot.next == () and unanswered_tool_calls(snapshot.values["messages"]) == []
    assert state["messages"][-1].content == snapshot.values["messages"][-1].content
    after = await play(h, graph, thread, "Thanks. Is anything left to do?", scenario.tenant_id)  # the next message
    assert isinstance(after["messages"][-1], AIMessage) and unanswered_tool_calls(after["messages"]) == []
    drained = await h.worker.drain()  # the first drain after the restart
    assert (drained.claimed, drained.dispatched, drained.dead_lettered) == (1, 1, 0)
    assert await story_state(h, thread, ids) == STORY_END
    async with h.pool.connection() as conn:
        ledger = await (await conn.execute("SELECT tool_name FROM tool_executions WHERE thread_id = %s ORDER BY 1",
                                           (thread,))).fetchall()
    assert ledger == [("ApplyCredit",), ("CreateCreditMemo",), ("QueueRefund",)]


async def test_c46_the_first_drain_after_a_restart_pays_the_refund_once(h):
    sg = preset("full")
    scenario = h.scenario("refund")
    ids = await h.create_customers(scenario, sg)
    _, model = refund_story(h, ids)
    graph = build_graph(model, h.node(sg), checkpointer=h.saver)
    thread = h.thread("c46-drain")
    await play(h, graph, thread, scenario.prompt, scenario.tenant_id)
    await h.provider.open()  # the provider's own pool has connections to lose
    before = await started_at(h)

    await h.restart_server("immediate")  # between the commit of the refund's outbox row and its dispatch

    assert await started_at(h) > before
    drained = await h.worker.drain()
    assert (drained.claimed, drained.dispatched, drained.dead_lettered) == (1, 1, 0)
    assert (await h.worker.drain()).claimed == 0
    assert await story_state(h, thread, ids) == STORY_END


async def test_c46_a_checkpoint_write_cut_by_a_restart_after_the_commit_is_written_again(h):
    """The batch commits, then the checkpoint write waits on a lock another session holds on the checkpoint
    tables; the server restarts while the write waits. The run ends without an exception, from the write
    tried again on the new server."""
    sg = preset("full")
    scenario = h.scenario("refund")
    ids = await h.create_customers(scenario, sg)
    _, model = refund_story(h, ids)
    node = h.node(sg)
    holder = await psycopg.AsyncConnection.connect(h.url)  # not autocommit: its lock stays until it ends
    held: list[int] = []

    async def hold_the_checkpoint_tables(calls) -> None:
        if not held:
            await holder.execute("LOCK TABLE checkpoints, checkpoint_blobs, checkpoint_writes IN SHARE MODE")
            held.append(holder.info.backend_pid)

    node.hooks.after_commit.append(hold_the_checkpoint_tables)
    graph = build_graph(model, node, checkpointer=h.saver)
    thread = h.thread("c46-write")
    run = asyncio.create_task(play(h, graph, thread, scenario.prompt, scenario.tenant_id, durability="sync"))
    try:
        await waiting_on(h, held, run)  # the write after the committed batch waits on the lock
        before = await started_at(h)
        await h.restart_server("fast")  # cuts the holder and the waiting write
        await run  # raises nothing
    finally:
        run.cancel()
        await holder.close()

    assert await started_at(h) > before
    snapshot = await graph.aget_state(run_config(thread, tenant_id=scenario.tenant_id))
    assert snapshot.next == () and unanswered_tool_calls(snapshot.values["messages"]) == []
    await h.worker.drain()
    assert await story_state(h, thread, ids) == STORY_END


async def waiting_on(h: Harness, held: list[int], run: asyncio.Task) -> None:
    """Return once a session waits on the lock the holder took (polled on the server); fail when the run ends
    first or nothing waits within :data:`WAIT_CAP_S`."""
    deadline = time.monotonic() + WAIT_CAP_S
    async with await psycopg.AsyncConnection.connect(h.url, autocommit=True) as watcher:
        while True:
            assert not run.done(), run.exception() if run.done() and not run.cancelled() else "the run ended"
            if held and (await (await watcher.execute(WAITS_ON, (held[0],))).fetchone())[0]:
                return
            assert time.monotonic() < deadline, "no checkpoint write waited on the lock"
            await asyncio.sleep(POLL_S)


async def test_c46_the_server_restart_faults_keep_full_at_zero_and_break_a_first_draft(private_server):
    result = await run_experiment(2, ["naive", "full"], ["server_restart", "server_restart_immediate"], seed=0,
                                  progress=False)
    summary = result.summary
    assert summary.loc[["server_restart", "server_restart_immediate"], "full"].tolist() == [0, 0]
    assert summary["naive"].sum() > 0  # the fault bites: autocommit per statement applies a call twice
    assert result.rows["error"].isna().all()


async def test_c46_the_server_restart_faults_refuse_a_server_the_kit_does_not_run(monkeypatch):
    monkeypatch.setenv(db.ENV_VAR, "postgresql://someone@db.example.invalid:5432/postgres")
    with pytest.raises(ValueError, match="restart the database server; the kit restarts only its embedded one"):
        await run_experiment(1, ["full"], ["server_restart"], progress=False)
    with pytest.raises(db.DatabaseUnavailable, match="does not restart it"):
        db.restart_embedded("fast")
