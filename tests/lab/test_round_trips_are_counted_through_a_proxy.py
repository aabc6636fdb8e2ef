"""The round-trip counter (``agentlab.lab.roundtrips``) counts turns of the conversation with real PostgreSQL, from
any process that connects through it, and survives connections that end abruptly.

The figures are psycopg 3's, read off the protocol: a statement is Parse/Bind/Describe/Execute/Sync in one write,
answered at the Sync (one turn); a pipeline sends its statements and one Sync, answered together (one turn).
Startup is one turn under trust or peer authentication (StartupMessage, then AuthenticationOk ... ReadyForQuery),
two under a password or md5, three under SCRAM (two SASL exchanges after the StartupMessage).
"""

from __future__ import annotations

import asyncio
import sys

import psycopg
import pytest

from agentlab.lab.roundtrips import RoundTripCounter, Tally

STARTUP_TURNS = (1, 2, 3)  # trust or peer; password or md5; SCRAM


async def connect(counter: RoundTripCounter, url: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(counter.url(url), autocommit=True)


async def test_each_statement_in_autocommit_is_one_round_trip_after_one_startup(database_url):
    async with RoundTripCounter(database_url) as counter:
        async with await connect(counter, database_url) as conn:
            assert counter.connections == 1 and counter.round_trips == counter.startup_round_trips
            assert counter.startup_round_trips in STARTUP_TURNS
            before = counter.snapshot()
            for n in range(4):
                await conn.execute(f"SELECT {n}")
            assert counter.snapshot() - before == Tally(round_trips=4)
        assert counter.snapshot() - before == Tally(round_trips=4)  # Terminate gets no answer: no round trip


async def test_a_statement_run_a_fifth_time_costs_one_more_round_trip_to_prepare_it(database_url):
    async with RoundTripCounter(database_url) as counter:
        async with await connect(counter, database_url) as conn:
            before = counter.snapshot()
            for n in range(10):
                await conn.execute("SELECT %s::int", (n,))
            # psycopg prepares a statement once it has run prepare_threshold (5) times: a Parse and a Sync of its
            # own, answered before the statement is executed, so one round trip more for the ten
            assert (counter.snapshot() - before).round_trips == 11


async def test_three_statements_in_one_pipeline_are_one_round_trip(database_url):
    async with RoundTripCounter(database_url) as counter:
        async with await connect(counter, database_url) as conn:
            before = counter.snapshot()
            async with conn.pipeline():
                cursors = [await conn.execute(f"SELECT {n}") for n in range(3)]
            assert [await cur.fetchone() for cur in cursors] == [(0,), (1,), (2,)]
            assert counter.snapshot() - before == Tally(round_trips=1)


async def test_a_transaction_of_one_update_is_three_round_trips(database_url):
    async with RoundTripCounter(database_url) as counter:
        async with await connect(counter, database_url) as conn:
            await conn.execute("CREATE TEMP TABLE t (x int)")
            await conn.execute("INSERT INTO t VALUES (1)")
            before = counter.snapshot()
            async with conn.transaction():
                await conn.execute("UPDATE t SET x = x + 1")
            # psycopg sends BEGIN on its own and waits for it, then the UPDATE, then COMMIT: one turn each
            assert counter.snapshot() - before == Tally(round_trips=3)
            await conn.set_autocommit(False)
            before = counter.snapshot()
            await conn.execute("UPDATE t SET x = x + 1")  # the implicit BEGIN is a turn of its own too
            await conn.commit()
            assert counter.snapshot() - before == Tally(round_trips=3)


async def test_a_large_result_in_many_packets_is_one_round_trip(database_url):
    async with RoundTripCounter(database_url) as counter:
        async with await connect(counter, database_url) as conn:
            before = counter.snapshot()
            cur = await conn.execute("SELECT repeat('x', 1000) FROM generate_series(1, 5000)")  # about 5 MB
            assert len(await cur.fetchall()) == 5000
            assert counter.snapshot() - before == Tally(round_trips=1)


async def test_concurrent_connections_are_each_counted(database_url):
    async def two_statements():
        async with await connect(counter, database_url) as conn:
            await conn.execute("SELECT 1")
            await conn.execute("SELECT pg_sleep(0.01)")

    async with RoundTripCounter(database_url) as counter:
        await asyncio.gather(*(two_statements() for _ in range(20)))
        spent = counter.snapshot()
        assert (spent.connections, spent.query_round_trips) == (20, 40)
        assert spent.startup_round_trips in {20 * turns for turns in STARTUP_TURNS}


CHILD = """
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    for n in range(3):
        conn.execute("SELECT %s::int", (n,))
"""


async def test_a_child_process_connecting_through_the_counter_is_counted_too(database_url):
    async with RoundTripCounter(database_url) as counter:
        async with await connect(counter, database_url) as conn:
            await conn.execute("SELECT 1")
            child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, counter.url(database_url))
            assert await child.wait() == 0  # awaited: the proxy runs on this loop while the child talks through it
        spent = counter.snapshot()
        assert (spent.connections, spent.query_round_trips) == (2, 1 + 3)


async def test_a_terminated_connection_does_not_hang_the_counter(database_url):
    async with asyncio.timeout(30):
        async with RoundTripCounter(database_url) as counter:
            victim = await connect(counter, database_url)
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
                await admin.execute("SELECT pg_terminate_backend(%s)", (victim.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError):
                await victim.execute("SELECT 1")
            await victim.close()
            async with await connect(counter, database_url) as conn:  # the counter still serves
                assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
            left_open = await connect(counter, database_url)  # still open as the block ends: closed for it
        with pytest.raises(psycopg.OperationalError):
            await left_open.execute("SELECT 1")
        await left_open.close()
    assert asyncio.all_tasks() == {asyncio.current_task()}  # no task of the counter's left behind
