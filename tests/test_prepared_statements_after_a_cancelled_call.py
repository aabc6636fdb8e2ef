"""A call cancelled inside its pipeline must not break psycopg's prepared statements for the calls after it.

psycopg prepares a statement on its 6th execution on a connection (``prepare_threshold`` 5, the tools
pool's default); pipelined, it records the statement as prepared when it queues the Parse. When the
tool's UPDATE before it is cancelled (``statement_timeout``, SQLSTATE 57014, or an asyncio cancellation),
the server skips that Parse, and every later execution of the statement on the pooled connection was
refused with ``prepared statement "_pg3_N" does not exist`` (SQLSTATE 26000): ``FAILED [internal]`` for
every later call, in the same batch and in the next batches on that connection
(:mod:`agentlab.core.prepared`). The tool here has retail's shape: an UPDATE whose result it does not
read, then a SELECT that reads the row back. Each test runs the node on a pool of one connection, so the
next batch is on the same connection (the tool returns its backend pid)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from agentlab.core.prepared import forget_prepared
from agentlab.core.run_lock import ThreadBusy, acquire_lease
from agentlab.core.safeguards import preset
from agentlab.core.tools_node import Outcome, TransactionalToolsNode
from agentlab.core.toolspec import StrictArgs, Toolset, tool
from conftest import fetch, scalar

NOTE = "CREATE TABLE cancelled_note (id int PRIMARY KEY, body text NOT NULL); INSERT INTO cancelled_note VALUES (1, 'start')"
WARM_UP = 5  # applied batches before the cancelled one: the read-back SELECT's 6th execution is the one psycopg prepares


class SetNote(StrictArgs):
    """Set the note's body (the UPDATE sleeps ``sleep_s`` seconds first), then read it back."""

    body: str
    sleep_s: float = 0.0


async def set_note(conn, args, ctx):
    await conn.execute("UPDATE cancelled_note SET body = %s WHERE id = 1 AND pg_sleep(%s) IS NOT NULL",
                       (args["body"], args["sleep_s"]))  # its result is not read: its error comes with the next read
    body, pid = await (await conn.execute("SELECT body, pg_backend_pid() FROM cancelled_note WHERE id = 1")).fetchone()
    return {"body": body, "pid": pid}


class ClearNote(StrictArgs):
    """Set the note's body to NULL: refused by its NOT NULL (SQLSTATE 23502), read at once."""


async def clear_note(conn, args, ctx):
    await (await conn.execute("UPDATE cancelled_note SET body = NULL WHERE id = 1 RETURNING id")).fetchone()
    return {}


TOOLS = Toolset([tool(SetNote, set_note, writes=True), tool(ClearNote, clear_note, writes=True)])


def call(i: int, body: str, sleep_s: float = 0.0) -> dict:
    return {"name": "SetNote", "args": {"body": body, "sleep_s": sleep_s}, "id": f"call_{i}", "type": "tool_call"}


@pytest.fixture
async def one_connection(harness):
    """The harness's database with the note, and a pool of one connection made as the tools pool is."""
    async with harness.pool.connection() as conn:
        await conn.execute(NOTE)
    pool = AsyncConnectionPool(harness.url, min_size=1, max_size=1, open=False, kwargs={"autocommit": True})
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


def node(harness, pool, statement_timeout_ms: int) -> TransactionalToolsNode:
    return TransactionalToolsNode(pool, preset("full").replace(policy="partial", isolation=False,
                                                                statement_timeout_ms=statement_timeout_ms),
                                  toolset=TOOLS, events=harness.events)


async def warm_up(n: TransactionalToolsNode, thread_id: str) -> int:
    """A refused call, then WARM_UP applied batches; the backend pid of the pool's one connection.

    The refused call comes first, before the note's SELECT ever ran, under the atomic policy: its ROLLBACK
    TO and the batch's ROLLBACK are then statements psycopg has seen on the connection. (The first time
    psycopg sees a statement answered ``ROLLBACK``, as both are, it forgets its prepared statements: the
    desync shows once a connection has undone a call and a batch before, as every connection of a long
    replay has.)"""
    atomic = TransactionalToolsNode(n.pool, n.safeguards.replace(policy="atomic"), toolset=TOOLS, events=n.events)
    refused = await atomic.run_batch([{"name": "ClearNote", "args": {}, "id": "refused", "type": "tool_call"}],
                                     thread_id=thread_id)
    assert refused.results[0].translation.sqlstate == "23502"
    assert refused.rolled_back
    pids = set()
    for i in range(WARM_UP):
        batch = await n.run_batch([call(i, f"warm {i}")], thread_id=thread_id)
        assert [r.outcome for r in batch.results] == [Outcome.APPLIED]
        pids.add(batch.results[0].result["pid"])
    assert len(pids) == 1
    return pids.pop()


async def ledger(harness, thread_id: str) -> list[str]:
    return [i for (i,) in await fetch(harness, "SELECT tool_call_id FROM tool_executions WHERE thread_id = %s "
                                               "ORDER BY tool_call_id", (thread_id,))]


def applied(batch, i: int = 0) -> str:
    r = batch.results[i]
    tr = r.translation
    assert r.outcome is Outcome.APPLIED, (r.content, tr and tr.sqlstate, tr and tr.detail)
    return r.result["body"]


async def test_after_a_statement_timeout_the_next_batch_on_the_connection_is_applied(harness, one_connection):
    n = node(harness, one_connection, statement_timeout_ms=200)
    pid = await warm_up(n, "t-next")

    cancelled = await n.run_batch([call(WARM_UP, "never", sleep_s=2)], thread_id="t-next")
    assert cancelled.results[0].outcome is Outcome.FAILED
    assert cancelled.results[0].translation.sqlstate == "57014"
    assert await scalar(harness, "SELECT body FROM cancelled_note") == "warm 4"  # the cancelled call: not applied

    after = await n.run_batch([call(WARM_UP + 1, "after")], thread_id="t-next")
    assert applied(after) == "after"  # was FAILED [internal]: prepared statement "_pg3_N" does not exist (26000)
    assert after.results[0].result["pid"] == pid  # the same pooled connection
    assert await scalar(harness, "SELECT body FROM cancelled_note") == "after"
    assert await ledger(harness, "t-next") == [f"call_{i}" for i in range(WARM_UP)] + [f"call_{WARM_UP + 1}"]


async def test_after_a_statement_timeout_the_next_call_of_the_batch_is_applied(harness, one_connection):
    """Partial policy: the call after the cancelled one runs on the same connection, in the same transaction."""
    n = node(harness, one_connection, statement_timeout_ms=200)
    await warm_up(n, "t-same")

    batch = await n.run_batch([call(WARM_UP, "never", sleep_s=2), call(WARM_UP + 1, "sibling")], thread_id="t-same")
    assert batch.results[0].outcome is Outcome.FAILED
    assert batch.results[0].translation.sqlstate == "57014"
    assert applied(batch, 1) == "sibling"
    assert not batch.rolled_back
    assert await scalar(harness, "SELECT body FROM cancelled_note") == "sibling"
    assert await ledger(harness, "t-same") == [f"call_{i}" for i in range(WARM_UP)] + [f"call_{WARM_UP + 1}"]


async def test_after_an_asyncio_cancellation_mid_pipeline_the_next_batch_is_applied(harness, one_connection):
    """``asyncio.wait_for`` cancels the batch while its UPDATE runs: psycopg cancels the statement on the
    server (57014 there too) and the batch is rolled back; the connection goes back to the pool."""
    n = node(harness, one_connection, statement_timeout_ms=10_000)
    pid = await warm_up(n, "t-cancel")

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(n.run_batch([call(WARM_UP, "never", sleep_s=3)], thread_id="t-cancel"), 0.5)
    assert await scalar(harness, "SELECT body FROM cancelled_note") == "warm 4"

    after = await n.run_batch([call(WARM_UP + 1, "after")], thread_id="t-cancel")
    assert applied(after) == "after"
    assert after.results[0].result["pid"] == pid
    assert await scalar(harness, "SELECT body FROM cancelled_note") == "after"
    assert await ledger(harness, "t-cancel") == [f"call_{i}" for i in range(WARM_UP)] + [f"call_{WARM_UP + 1}"]


async def test_forget_prepared_after_the_exact_psycopg_sequence(harness, one_connection):
    """The node's sequence in plain psycopg: a read-back SELECT run 5 times, then pipelined after an UPDATE
    the timeout cancels. psycopg records it as prepared though the server skipped its Parse; after
    :func:`forget_prepared` it runs (prepared again on its 6th execution after that, and it exists then)."""
    query = "SELECT body FROM cancelled_note WHERE id = %s"
    async with one_connection.connection() as conn:
        await conn.execute("BEGIN")
        await conn.execute("ROLLBACK")  # seen once before: the ROLLBACK below does not clear psycopg's cache
        for _ in range(5):
            await (await conn.execute(query, (1,))).fetchone()
        with pytest.raises(Exception) as cancelled:
            async with conn.pipeline():
                await conn.execute("BEGIN")
                await conn.execute("SELECT set_config('statement_timeout', '100ms', true)")
                await conn.execute("UPDATE cancelled_note SET body = 'never' WHERE id = 1 AND pg_sleep(1) IS NOT NULL")
                await (await conn.execute(query, (1,))).fetchone()
        assert cancelled.value.sqlstate == "57014"
        await conn.execute("ROLLBACK")
        forget_prepared(conn)
        for _ in range(7):  # past the threshold again: prepared anew, and this time the server has it
            assert await (await conn.execute(query, (1,))).fetchone() == ("start",)
        prepared = await (await conn.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s",
                                             (query.replace("%s", "$1"),))).fetchone()
        assert prepared == (1,)


async def test_a_lease_refused_by_nowait_leaves_the_next_acquisition_working(harness, one_connection):
    """The same skip outside the tools node: the lease's acquisition is pipelined, and when its ``FOR UPDATE
    NOWAIT`` is refused (55P03, a batch holds the row) the server skips its INSERT, on that INSERT's 6th
    execution the one psycopg prepares. The next acquisition on the connection takes its lease."""
    async with one_connection.connection() as conn:
        await conn.execute("BEGIN")
        await conn.execute("ROLLBACK")  # seen once before: the refusal's ROLLBACK does not clear psycopg's cache
    for i in range(5):
        await acquire_lease(one_connection, f"lease-{i}")
    async with await psycopg.AsyncConnection.connect(harness.url, autocommit=True) as batch:
        await batch.execute("BEGIN")
        await batch.execute("SELECT 1 FROM runs.thread_leases WHERE thread_id = 'lease-0' FOR UPDATE")
        with pytest.raises(ThreadBusy):
            await acquire_lease(one_connection, "lease-0")
        await batch.execute("ROLLBACK")
    lease = await acquire_lease(one_connection, "lease-5")  # was InvalidSqlStatementName (26000)
    assert await fetch(harness, "SELECT owner_token FROM runs.thread_leases WHERE thread_id = 'lease-5'") == [
        (lease.owner_token,)]
