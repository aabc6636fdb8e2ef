"""The safe path pipelined: the batch's calls share one pipeline; each call's SAVEPOINT goes out with its first
statement, its ledger row and RELEASE with the next call's SAVEPOINT and first statement, and the last call's
with COMMIT in the batch's Sync. An error stays its own call's wherever in the pipeline it comes from (the
tool's statement, a statement whose result the tool never read, a ledger row answered with the next call's
statements, the ledger row of the last call, whose COMMIT the server then skips), and a lost connection is
the same error as outside a pipeline."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

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


class AddNoteCatchingAll(StrictArgs):
    """Add a note; whatever the database answers, return (a tool that swallows every database error)."""

    body: str


async def add_note_catching_all(conn, args, ctx):
    try:
        row = await (await conn.execute("INSERT INTO pipelined_notes (body) VALUES (%s) RETURNING id",
                                        (args["body"],))).fetchone()
    except psycopg.Error:
        return {"note_id": None}
    return {"note_id": row[0]}


class AddNoteAfterKill(StrictArgs):
    """Terminate this connection's own backend from another connection, then add a note."""

    body: str


KILL_URL: list[str] = []  # the database a test's AddNoteAfterKill connects to


async def add_note_after_kill(conn, args, ctx):
    async with await psycopg.AsyncConnection.connect(KILL_URL[0], autocommit=True) as other:
        await other.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    return await add_note(conn, {**args, "echo": ""}, ctx)


TOOLS = Toolset([tool(AddNote, add_note, writes=True), tool(AddNoteUnread, add_note_unread, writes=True),
                 tool(AddNoteOrCount, add_note_or_count, writes=True),
                 tool(AddNoteCatchingAll, add_note_catching_all, writes=True),
                 tool(AddNoteAfterKill, add_note_after_kill, writes=True)])

# A ledger row the database refuses for one tool call id: the trigger fails that call's INSERT INTO
# tool_executions, which the pipeline sends with the next call's SAVEPOINT and first statement.
REFUSE_LEDGER_ROW = """
CREATE FUNCTION refuse_ledger_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tool_call_id = {call_id} THEN
        RAISE EXCEPTION 'ledger row refused for %', NEW.tool_call_id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_ledger_row BEFORE INSERT ON tool_executions FOR EACH ROW EXECUTE FUNCTION refuse_ledger_row();
"""


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


async def refuse_ledger_row(harness, call_id: str) -> None:
    """Install the trigger refusing ``call_id``'s ledger row in the test's own database."""
    async with harness.pool.connection() as conn:
        await conn.execute(sql.SQL(REFUSE_LEDGER_ROW).format(call_id=sql.Literal(call_id)))


async def ledger(harness, thread_id: str) -> list[tuple]:
    async with harness.pool.connection() as conn:
        return await (await conn.execute("SELECT tool_call_id, result FROM tool_executions WHERE thread_id = %s "
                                          "ORDER BY tool_call_id", (thread_id,))).fetchall()


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


@pytest.mark.parametrize("refused", [0, 1])
async def test_a_ledger_row_refused_with_the_next_calls_statements_fails_its_own_call_and_the_next_runs_once(
        harness, refused):
    """Call ``refused``'s ledger row goes out with the next call's SAVEPOINT and INSERT and is refused: the
    server skips the next call's statements, so that call is run again and applied exactly once."""
    node = await setup(harness, "partial")
    await refuse_ledger_row(harness, f"call_{refused}")
    bodies = ["first", "second", "third"]
    batch = await node.run_batch([call(i, body=b) for i, b in enumerate(bodies)], thread_id=f"t-p6-{refused}")

    expected = [Outcome.APPLIED] * 3
    expected[refused] = Outcome.FAILED
    assert [r.outcome for r in batch.results] == expected
    failed = batch.results[refused]
    assert failed.translation.sqlstate == "P0001"  # the trigger's RAISE EXCEPTION
    assert f"ledger row refused for call_{refused}" in failed.translation.detail
    assert [(m.tool_call_id, m.status) for m in batch.messages] == [
        (f"call_{i}", "error" if i == refused else "success") for i in range(3)]
    kept = [b for i, b in enumerate(bodies) if i != refused]
    assert await notes(harness) == kept  # the refused call is undone, the call after it applied once
    rows = await ledger(harness, f"t-p6-{refused}")
    assert [cid for cid, _ in rows] == [f"call_{i}" for i in range(3) if i != refused]
    by_id = {r.call_id: r.result for r in batch.results if r.outcome is Outcome.APPLIED}
    assert all(result == by_id[cid] for cid, result in rows)  # each stored result is the one reported
    assert await scalar(harness, "SELECT count(*) FROM pipelined_notes WHERE id = %s",
                        (by_id[f"call_{refused + 1}"]["note_id"],)) == 1


async def test_under_atomic_a_ledger_row_refused_with_the_next_calls_statements_rolls_the_batch_back(harness):
    node = await setup(harness, "atomic")
    await refuse_ledger_row(harness, "call_0")
    batch = await node.run_batch([call(0, body="first"), call(1, body="second")], thread_id="t-p7")

    assert [r.outcome for r in batch.results] == [Outcome.FAILED, Outcome.NOT_APPLIED]
    assert batch.results[0].translation.sqlstate == "P0001"
    assert batch.rolled_back
    assert await notes(harness) == []
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0


async def test_a_result_the_ledger_refuses_fails_its_call_when_the_next_call_carries_its_row(harness):
    """A NUL in a call's result (argument validation off lets it through): JSONB refuses its ledger row,
    answered with the next call's first statement."""
    node = await setup(harness, "partial", validation=False)
    batch = await node.run_batch([call(0, body="undone", echo="a\x00b"), call(1, body="kept", echo="")],
                                 thread_id="t-p8")

    assert [r.outcome for r in batch.results] == [Outcome.FAILED, Outcome.APPLIED]
    assert batch.results[0].content.startswith(FAILED_PREFIX)
    assert batch.results[0].translation.sqlstate == "22P05"  # untranslatable character
    assert await notes(harness) == ["kept"]
    assert [cid for cid, _ in await ledger(harness, "t-p8")] == ["call_1"]


async def test_a_tool_that_catches_the_earlier_calls_error_runs_again_and_the_earlier_call_fails(harness):
    """The next call's tool catches the refused ledger row's error itself: the earlier call still fails (its
    reason is then unknown to the node: internal), and the catching call is run again on a usable
    transaction; its ledger row holds the second run's result."""
    node = await setup(harness, "partial")
    await refuse_ledger_row(harness, "call_0")
    batch = await node.run_batch([call(0, body="first"), call(1, "AddNoteCatchingAll", body="second")],
                                 thread_id="t-p9")

    assert [r.outcome for r in batch.results] == [Outcome.FAILED, Outcome.APPLIED]
    assert batch.results[0].content.startswith(f"{FAILED_PREFIX} [internal]")
    note_id = batch.results[1].result["note_id"]
    assert note_id is not None
    assert await notes(harness) == ["second"]
    assert await ledger(harness, "t-p9") == [("call_1", {"note_id": note_id})]


async def test_a_backend_terminated_while_a_calls_ledger_row_awaits_its_answer_is_the_servers_own_error(harness):
    """No hook: call 0's ledger row and RELEASE are in the pipeline, unanswered, when call 1's tool has the
    backend terminated; the node raises the server's ``AdminShutdown`` as outside a pipeline."""
    node = await setup(harness, "partial")
    KILL_URL[:] = [harness.url]
    with pytest.raises(psycopg.errors.AdminShutdown, match="terminating connection"):
        await node.run_batch([call(0, body="a"), call(1, "AddNoteAfterKill", body="b")], thread_id="t-p10")
    assert await notes(harness) == []
    assert await scalar(harness, "SELECT count(*) FROM tool_executions") == 0
    async with harness.pool.connection() as conn:
        assert await (await conn.execute("SELECT 1")).fetchone() == (1,)


@pytest.mark.parametrize("hook", [None, "before_call", "after_call"])
async def test_calls_fold_into_one_pipeline_unless_a_hook_runs_between_them(harness, hook):
    """Three one-statement calls: 1 round trip to open, 1 per call, 1 for the Sync carrying COMMIT (5). A hook
    sees the batch between calls: each call then ends with its own Sync (1 + 2 per call; after an
    ``after_call`` hook COMMIT is one more)."""
    from agentlab.bench.batch import traced_statements

    await setup(harness, "partial")
    seen: list[int] = []

    async def note_index(c, index):
        seen.append(index)

    async def batch(pool):
        node = TransactionalToolsNode(pool, preset("full").replace(policy="partial", isolation=False), toolset=TOOLS,
                                      events=harness.events)
        if hook is not None:
            getattr(node.hooks, hook).append(note_index)
        result = await node.run_batch([call(i, body=f"n{i}") for i in range(3)], thread_id=f"t-p11-{hook}")
        assert [r.outcome for r in result.results] == [Outcome.APPLIED] * 3

    sent = await traced_statements(harness.url, batch)
    assert sent.round_trips == {None: 5, "before_call": 7, "after_call": 8}[hook]
    assert sent.statements.count("COMMIT") == 1
    assert seen == ([] if hook is None else [0, 1, 2])
    assert await notes(harness) == ["n0", "n1", "n2"]
