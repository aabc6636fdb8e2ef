"""The safe path pipelined: each call's SAVEPOINT goes out with its first statement, its ledger row with its
RELEASE, and the last call's Sync carries COMMIT. An error stays its own call's wherever in the pipeline
it comes from (the tool's statement, a statement whose result the tool never read, the ledger row of the
last call, whose COMMIT the server then skips), and a lost connection is the same error as outside a
pipeline."""

from __future__ import annotations

import psycopg
import pytest

from agentlab.core.messages import FAILED_PREFIX
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome, TransactionalToolsNode
from agentlab.core.toolspec import StrictArgs, Toolset, tool
from conftest import scalar

NOTES = "CREATE TABLE pipelined_notes (id serial PRIMARY KEY, body text NOT NULL CHECK (body <> 'refused'))"


class AddNote(StrictArgs):
    """Add a note; its result echoes ``echo`` (a NUL character there is a result the ledger's JSONB refuses)."""

    body: str
    echo: str = ""


class AddNoteUnread(StrictArgs):
    """Add a note without reading the statement's result (its error comes with the call's Sync)."""

    body: str


async def add_note(conn, args, ctx):
    row = await (await conn.execute("INSERT INTO pipelined_notes (body) VALUES (%s) RETURNING id",
                                    (args["body"],))).fetchone()
    return {"note_id": row[0], "echo": args["echo"]}


async def add_note_unread(conn, args, ctx):
    await conn.execute("INSERT INTO pipelined_notes (body) VALUES (%s)", (args["body"],))
    return {"added": True}


class AddNoteOrCount(StrictArgs):
    """Add a note; when the database refuses it, carry on and count the notes (a tool that swallows an error)."""

    body: str


async def add_note_or_count(conn, args, ctx):
    try:
        await (await conn.execute("INSERT INTO pipelined_notes (body) VALUES (%s) RETURNING id",
                                  (args["body"],))).fetchone()
    except psycopg.errors.CheckViolation:
        pass
    return {"notes": (await (await conn.execute("SELECT count(*) FROM pipelined_notes")).fetchone())[0]}


TOOLS = Toolset([tool(AddNote, add_note, writes=True), tool(AddNoteUnread, add_note_unread, writes=True),
                 tool(AddNoteOrCount, add_note_or_count, writes=True)])


def call(i: int, name: str = "AddNote", **args) -> dict:
    return {"name": name, "args": args, "id": f"call_{i}", "type": "tool_call"}


async def setup(harness, policy: str = "partial", **changes) -> TransactionalToolsNode:
    async with harness.pool.connection() as conn:
        await conn.execute(NOTES)
        await conn.execute("GRANT ALL ON pipelined_notes, pipelined_notes_id_seq TO PUBLIC")
    return TransactionalToolsNode(harness.pool, preset("full").replace(policy=policy, isolation=False, **changes),
                                  toolset=TOOLS, events=harness.events)


async def notes(harness) -> list[str]:
    async with harness.pool.connection() as conn:
        return [b for (b,) in await (await conn.execute("SELECT body FROM pipelined_notes ORDER BY id")).fetchall()]


async def test_the_last_calls_refused_ledger_row_fails_it_alone_and_the_others_commit(harness):
    node = await setup(harness, "partial")
    batch = await node.run_batch([call(0, body="kept"), call(1, body="undone", echo="a\x00b")], thread_id="t-p1")

    assert [r.outcome for r in batch.results] == [Outcome.APPLIED, Outcome.FAILED]
    assert batch.results[1].content.startswith(FAILED_PREFIX)
    # the COMMIT that went with the last call was skipped by the server; the node committed the first call
    assert await notes(harness) == ["kept"]
    assert await scalar(harness, "SELECT count(*) FROM tool_executions WHERE thread_id = 't-p1'") == 1


async def test_under_atomic_the_last_calls_refused_ledger_row_rolls_the_batch_back(harness):
    node = await setup(harness, "atomic")
    batch = await node.run_batch([call(0, body="first"), call(1, body="second", echo="\x00")], thread_id="t-p2")

    assert [r.outcome for r in batch.results] == [Outcome.NOT_APPLIED, Outcome.FAILED]
    assert batch.rolled_back
    assert await notes(harness) == []
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0


async def test_an_unread_statements_error_is_its_own_calls_and_the_next_call_runs(harness):
    node = await setup(harness, "partial")
    batch = await node.run_batch([call(0, "AddNoteUnread", body="refused"), call(1, body="after")],
                                 thread_id="t-p3")

    assert [r.outcome for r in batch.results] == [Outcome.FAILED, Outcome.APPLIED]
    assert batch.results[0].content.startswith(f"{FAILED_PREFIX} [business_rule]")
    assert batch.results[0].translation.sqlstate == "23514"
    assert await notes(harness) == ["after"]


@pytest.mark.parametrize("savepoints", [True, False])
async def test_a_tool_that_swallows_its_error_meets_the_aborted_transaction_in_a_pipeline_or_not(harness, savepoints):
    """Its next statement is refused with SQLSTATE 25P02 either way (pipelined the server skips it and psycopg
    says ``PipelineAborted``): not an outage to retry, and the call after it runs (partial policy)."""
    node = await setup(harness, "partial", savepoints=savepoints)
    batch = await node.run_batch([call(0, "AddNoteOrCount", body="refused"), call(1, body="after")],
                                 thread_id=f"t-p5-{savepoints}")

    assert batch.results[0].translation.sqlstate == "25P02"
    assert batch.results[0].outcome is Outcome.NOT_APPLIED
    if savepoints:  # the savepoint undid the call alone; without one the transaction stayed aborted (C09)
        assert batch.results[1].outcome is Outcome.APPLIED
        assert await notes(harness) == ["after"]
    else:
        assert await notes(harness) == []


@pytest.mark.parametrize("savepoints", [True, False])
async def test_a_backend_terminated_before_a_call_is_the_servers_own_error_in_a_pipeline_or_not(harness, savepoints):
    """Pipelined (savepoints on) the server's FATAL reaches libpq as a notice; the node raises it as the
    same ``AdminShutdown`` (SQLSTATE 57P01) the unpipelined path (savepoints off) gets from psycopg."""
    node = await setup(harness, "atomic", savepoints=savepoints)

    async def kill_before_second(c, index):
        if index == 1:
            async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as other:
                await other.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                                    "current_database() AND state LIKE 'idle in transaction%%'")

    node.hooks.before_call.append(kill_before_second)
    with pytest.raises(psycopg.errors.AdminShutdown, match="terminating connection"):
        await node.run_batch([call(0, body="a"), call(1, body="b")], thread_id=f"t-p4-{savepoints}")
    assert await notes(harness) == []
    async with harness.pool.connection() as conn:  # the pool hands out a healthy connection next
        assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
