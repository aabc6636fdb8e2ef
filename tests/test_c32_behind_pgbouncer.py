"""C32(b): behind a transaction-mode pooler nothing the kit needs for correctness rests on a session lock.

Each test starts a real PgBouncer (``pool_mode = transaction``) on 127.0.0.1 in front of the test's
PostgreSQL and opens the harness through it (``behind_pooler=True``). There a session advisory lock
lands on whichever server session the pooler lends for that one statement: re-entrant for every client
lent the same session, and its unlock may be lent another one. What must hold anyway:

- two saga runners on one run: the one that lost the run cannot commit a step (fencing on the locked
  run row), whether the session lock is taken (and shared) or not taken at all (``behind_pooler``);
- a session lock's unlock lent another server session leaves the lock held on a session nobody
  watches: a runner that takes it is refused on a finished run, so ``behind_pooler=True`` takes none;
- the tools node's per-thread ``pg_advisory_xact_lock`` and retention's ``pg_try_advisory_xact_lock``
  are transaction-scoped: exclusive across pooled clients; jobs are fenced by their attempt;
- under the weaker setting (``fencing=False``) the violation shows through the pooler: paid twice.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from pooler import pgbouncer
from psycopg_pool import AsyncConnectionPool

from agentlab.core.graph import build_graph, run_config
from agentlab.core.safeguards import preset
from agentlab.demos.payout_saga import (
    backward_recovery,
    escalation,
    forward_recovery,
    notice_model,
    payout_effects,
    payout_input,
    store_credit_payout,
)
from agentlab.domains.billing.scenarios import CustomerSpec, create_customers, get_scenario
from agentlab.durable.jobs import JobStore
from agentlab.durable.retention import RetentionPolicy, apply_retention
from agentlab.durable.saga import Backoff, SagaBusy, SagaFenced, SagaRunner
from agentlab.lab.invariants import check_episode, count_by_kind
from agentlab.lab.row_lock import RowLock
from agentlab.runtime.harness import Harness
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

FAST = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=4, initial_s=0.01),
        "compensation_retry": Backoff(max_attempts=2, initial_s=0.01)}
OPENING, AMOUNT = 5000, 2000
SERVER_ADVISORY_LOCKS = """
SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY l.pid
"""
PID = "SELECT pg_backend_pid()"


async def server_rows(database_url: str, query: str, params=()) -> list[tuple]:
    """What the server itself shows, on a direct connection (not through the pooler)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        return await (await conn.execute(query, params)).fetchall()


async def pooled_harness(url: str) -> Harness:
    return await Harness.open(url, behind_pooler=True)


async def new_customer(h: Harness, name: str) -> int:
    async with h.pool.connection() as conn:
        (cid,) = await create_customers(conn, [CustomerSpec("acme", name, OPENING)], "public")
    return cid


async def second_runner_aborts_while_the_first_backs_off(h: Harness, a: SagaRunner, b: SagaRunner, key: str,
                                                         seen: dict, database_url: str) -> int:
    """Runner A's step 4 meets a busy row and backs off; meanwhile runner B aborts the run. Returns the
    customer id; ``seen["b"]`` is B's report, ``seen["advisory_pids"]`` the server's advisory locks then."""
    cid = await new_customer(h, key)
    held: list[RowLock] = []

    async def busy_before_the_refund(position, name):
        if position == 3:
            held.append(await RowLock.acquire(database_url, cid))  # another session, direct

    async def b_aborts_while_a_backs_off(position, attempt, exc):
        if position == 4 and "b" not in seen:
            while held:
                await held.pop().release()
            seen["advisory_pids"] = [r[0] for r in await server_rows(database_url, SERVER_ADVISORY_LOCKS)]
            run_id = await scalar(h, "SELECT id FROM saga_runs WHERE run_key = %s", (key,))
            seen["b"] = await b.abort(run_id, "a second runner got in")

    a.hooks.after_step.append(busy_before_the_refund)
    a.hooks.after_failure.append(b_aborts_while_a_backs_off)
    try:
        with pytest.raises(SagaFenced, match="claimed by another runner"):
            await a.start(key, payout_input(cid, AMOUNT, key))
    finally:
        while held:
            await held.pop().release()
    return cid


async def assert_compensated_once(h: Harness, cid: int, run_id: int) -> None:
    assert await fetch(h, "SELECT status, direction FROM saga_runs WHERE id = %s", (run_id,)) == [
        ("compensated", "backward")]
    assert await fetch(h, "SELECT position, status FROM saga_steps WHERE run_id = %s ORDER BY position", (run_id,)) == [
        (1, "compensated"), (2, "compensated"), (3, "sent_but_unwound"), (4, "failed")]
    assert await scalar(h, "SELECT count(*) FROM saga_log WHERE run_id = %s AND position = 4 AND action = 'completed'",
                        (run_id,)) == 0
    assert await scalar(h, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,)) == 0
    assert await payout_effects(h, cid, OPENING) == {
        "credit_deducted_cents": 0, "refunds_at_provider": 0, "refunded_cents": 0, "notices_sent": 1,
        "corrections_sent": 1}
    sent = await h.notifier.messages(f"customer-{cid}@example.com")
    assert [m["corrects"] is not None for m in sent] == [False, True]  # the notice, then its correction


async def test_c32_two_runners_behind_pgbouncer_take_no_session_lock_and_the_loser_cannot_commit(database_url):
    with pgbouncer(database_url, pool_size=2) as url:
        h = await pooled_harness(url)
        try:
            saga = store_credit_payout(notice_model())
            a = SagaRunner(h.pool, saga, behind_pooler=True, **FAST)
            b = SagaRunner(h.pool, saga, behind_pooler=True, **FAST)
            seen: dict = {}
            cid = await second_runner_aborts_while_the_first_backs_off(h, a, b, "payout-c32-pooler", seen,
                                                                       database_url)
            assert seen["advisory_pids"] == []  # no lock on any server session: nothing left to leak
            assert seen["b"].status == "compensated" and seen["b"].compensations == [3, 2, 1]
            await assert_compensated_once(h, cid, seen["b"].run_id)
            assert await scalar(h, "SELECT count(*) FROM provider.payments WHERE customer = %s",
                                (f"cus_{cid}",)) == 0
        finally:
            await h.close()


async def test_c32_a_session_lock_behind_pgbouncer_is_shared_and_fencing_still_holds(database_url):
    # the runners reach the server through a pooler with one server session: every client is lent it
    with pgbouncer(database_url, pool_size=2) as url, pgbouncer(database_url, pool_size=1) as runners_url:
        h = await pooled_harness(url)
        runners = AsyncConnectionPool(runners_url, min_size=1, max_size=4, open=False,
                                      kwargs={"autocommit": True, "prepare_threshold": None})
        await runners.open(wait=True)
        try:
            saga = store_credit_payout(notice_model())
            a, b = SagaRunner(runners, saga, **FAST), SagaRunner(runners, saga, **FAST)  # session locks taken
            seen: dict = {}
            cid = await second_runner_aborts_while_the_first_backs_off(h, a, b, "payout-c32-shared", seen,
                                                                       database_url)
            # A's session lock sat on the one server session; B was lent that session and re-entered it
            assert len(seen["advisory_pids"]) == 1
            assert seen["b"].status == "compensated"
            await assert_compensated_once(h, cid, seen["b"].run_id)
        finally:
            await runners.close()
            await h.close()


async def test_c32_an_unlock_lent_another_server_session_leaves_the_lock_held_so_behind_pooler_takes_none(
        database_url):
    with pgbouncer(database_url, pool_size=2) as url:
        h = await pooled_harness(url)
        pinned: list[psycopg.AsyncConnection] = []
        try:
            saga = store_credit_payout(notice_model())
            cid = await new_customer(h, "Leaked lock")
            runner = SagaRunner(h.pool, saga, **FAST)  # takes a session lock, as without behind_pooler
            where: dict = {}

            async def pin_the_lock_session(position, name):
                """After step 1, hold a transaction on the server session that has the run's lock, so the
                runner's later statements, its unlock included, are lent the other one."""
                if position != 1:
                    return
                (where["lock_pid"],) = [r[0] for r in await server_rows(database_url, SERVER_ADVISORY_LOCKS)]
                for _ in range(2):
                    conn = await psycopg.AsyncConnection.connect(url, prepare_threshold=None)
                    pid = (await (await conn.execute(PID)).fetchone())[0]  # BEGIN: the session stays lent
                    if pid == where["lock_pid"]:
                        pinned.append(conn)
                        break
                    where.setdefault("others", []).append(conn)
                for conn in where.pop("others", []):  # give the other session back to the pooler
                    await conn.rollback()
                    await conn.close()
                assert pinned, "no pooled client was lent the session holding the lock"

            runner.hooks.after_step.append(pin_the_lock_session)
            done = await runner.start("payout-c32-leak", payout_input(cid, AMOUNT, "payout-c32-leak"))
            assert done.status == "completed"
            # the unlock went to the other session: the lock is still held, by a session no runner watches
            assert [r[0] for r in await server_rows(database_url, SERVER_ADVISORY_LOCKS)] == [where["lock_pid"]]
            with pytest.raises(SagaBusy, match="being run by another runner"):
                await SagaRunner(h.pool, saga, **FAST).resume(done.run_id)  # a finished run, refused
            while pinned:  # the outbox worker needs both server sessions again (a claim and a send)
                await pinned.pop().close()
            again = await SagaRunner(h.pool, saga, behind_pooler=True, **FAST).resume(done.run_id)
            assert again.status == "completed"
            assert await payout_effects(h, cid, OPENING) == {
                "credit_deducted_cents": AMOUNT, "refunds_at_provider": 1, "refunded_cents": AMOUNT,
                "notices_sent": 1, "corrections_sent": 0}
        finally:
            for conn in pinned:
                await conn.close()
            await h.close()


async def test_c32_without_fencing_behind_pgbouncer_the_second_runner_makes_the_payout_twice(database_url):
    """The weaker setting: the session lock is all that keeps runners apart, and behind the pooler it
    keeps nothing apart. B compensates 3, 2, 1 while A's retry of step 4 commits."""
    with pgbouncer(database_url, pool_size=2) as url:
        h = await pooled_harness(url)
        try:
            saga = store_credit_payout(notice_model())
            a = SagaRunner(h.pool, saga, behind_pooler=True, fencing=False, **FAST)
            b = SagaRunner(h.pool, saga, behind_pooler=True, fencing=False, **FAST)
            cid = await new_customer(h, "Unfenced")
            held: list[RowLock] = []
            seen: dict = {}

            async def busy_before_the_refund(position, name):
                if position == 3:
                    held.append(await RowLock.acquire(database_url, cid))  # another session, direct

            async def b_aborts(position, attempt, exc):
                if position == 4 and not seen:
                    while held:
                        await held.pop().release()
                    run_id = await scalar(h, "SELECT id FROM saga_runs WHERE run_key = 'payout-unfenced'")
                    seen["b"] = await b.abort(run_id, "a second runner got in")

            a.hooks.after_step.append(busy_before_the_refund)
            a.hooks.after_failure.append(b_aborts)
            report = await a.start("payout-unfenced", payout_input(cid, AMOUNT, "payout-unfenced"))
            assert report.status == "completed"
            assert await fetch(h, "SELECT status FROM saga_steps WHERE run_id = %s ORDER BY position",
                               (report.run_id,)) == [("compensated",), ("compensated",), ("sent_but_unwound",),
                                                     ("completed",)]
            assert await payout_effects(h, cid, OPENING) == {
                "credit_deducted_cents": 0, "refunds_at_provider": 1, "refunded_cents": AMOUNT,
                "notices_sent": 1, "corrections_sent": 1}
        finally:
            await h.close()


async def test_the_tools_node_and_retention_thread_locks_hold_across_pooled_clients(database_url):
    with pgbouncer(database_url, pool_size=3) as url:
        h = await pooled_harness(url)
        try:
            sg, scenario = preset("full"), get_scenario("refund")
            ep = await h.run_episode(scenario, sg, thread_id="pooled-refund")
            assert ep.error is None
            assert count_by_kind(await check_episode(h.pool, ep, scenario, sg)) == count_by_kind([])

            x = "pooled-chat"  # an old, finished chat, classified for deletion
            config = run_config(x, tenant_id=scenario.tenant_id)
            chat = h.graph(sg, ScriptedChatModel(script=[], seed=0, final_text="Hello! How can I help?"))
            await chat.ainvoke({"messages": [HumanMessage("Hi")]}, config, durability="sync")
            async with h.pool.connection() as conn:
                await conn.execute("UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', to_jsonb("
                                   "((checkpoint ->> 'ts')::timestamptz - interval '100 days')::text)) "
                                   "WHERE thread_id = %s", (x,))
            plan = await apply_retention(h.saver, h.pool, RetentionPolicy(), dry_run=True)
            assert plan.deleted == [x] and plan.kept == ["pooled-refund"]

            # the user comes back to X; while its batch holds the thread lock, another client and retention try
            ids = await h.create_customers(scenario, sg)
            node = h.node(sg)
            graph = build_graph(ScriptedChatModel(script=scenario.script(ids), seed=0), node, checkpointer=h.saver)
            inside: dict = {}

            async def meanwhile(call, index):
                if inside:
                    return
                inside["other_client_got_lock"] = await scalar(
                    h, "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", (x,))
                inside["retention"] = await apply_retention(h.saver, h.pool, RetentionPolicy(), plan=plan)

            node.hooks.before_call.append(meanwhile)
            await graph.ainvoke({"messages": [HumanMessage(scenario.prompt)]}, config, durability="sync")
            assert inside["other_client_got_lock"] is False
            assert inside["retention"].deleted == [] and inside["retention"].left_alone == [x]
            assert await scalar(h, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (x,)) > 0
            assert await scalar(h, "SELECT count(*) FROM refunds WHERE customer_id = %s", (ids[0],)) == 1
        finally:
            await h.close()


async def test_jobs_behind_pgbouncer_run_once_for_concurrent_clients(database_url):
    with pgbouncer(database_url, pool_size=2) as url:
        h = await pooled_harness(url)
        try:
            store = JobStore(h.pool)
            cid = await new_customer(h, "Jobs")
            calls: list[int] = []

            async def work(conn, args):
                calls.append(1)
                await conn.execute("SELECT pg_sleep(0.2)")
                cur = await conn.execute(
                    "INSERT INTO invoices (tenant_id, customer_id, billing_period, amount_cents) "
                    "SELECT tenant_id, id, %s, %s FROM customers WHERE id = %s RETURNING id",
                    (args["billing_period"], args["amount_cents"], args["customer_id"]))
                return {"invoice_id": (await cur.fetchone())[0]}

            args = {"customer_id": cid, "billing_period": "2026-08-01", "amount_cents": 4200}
            results = await asyncio.gather(*[store.run(f"invoice:{cid}:2026-08", "invoice", args, work, timeout_s=10)
                                             for _ in range(6)])
            assert len(calls) == 1 and sum(not r.replayed for r in results) == 1
            assert len({str(r.result) for r in results}) == 1
            assert await scalar(h, "SELECT count(*) FROM invoices WHERE customer_id = %s", (cid,)) == 1
            assert await fetch(h, "SELECT status, attempt FROM jobs WHERE job_key = %s", (f"invoice:{cid}:2026-08",)) == [
                ("succeeded", 1)]
        finally:
            await h.close()


async def test_the_three_recoveries_behind_pgbouncer_take_no_session_lock_and_end_as_on_the_server(database_url):
    with pgbouncer(database_url, pool_size=3) as url:
        h = await pooled_harness(url)
        try:
            saga = store_credit_payout(notice_model())
            ends = {}
            for name, recovery in (("forward", forward_recovery), ("backward", backward_recovery),
                                   ("escalation", escalation)):
                cid = await new_customer(h, name)
                report = await recovery(h, saga, cid, AMOUNT, f"SC-{name}", **FAST)
                ends[name] = (report.status, report.compensations,
                              (await payout_effects(h, cid, OPENING))["credit_deducted_cents"])
            assert ends == {"forward": ("completed", [], AMOUNT), "backward": ("compensated", [3, 2, 1], 0),
                            "escalation": ("parked", [3, 2], AMOUNT)}
            assert await server_rows(database_url, SERVER_ADVISORY_LOCKS) == []
        finally:
            await h.close()
