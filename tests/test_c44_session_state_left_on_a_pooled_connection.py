"""C44: a tool handler leaves session state on its pooled connection; later batches start from the defaults.

A user's domain adds a tool whose handler runs a session-level ``SET`` (``search_path``, ``ROLE``,
``statement_timeout``) inside the batch's transaction, which commits, so the setting outlives it. The
harness's pool holds one connection, so every later batch, on any thread and under any preset, gets the
connection the handler ran on. Each later batch must behave as on a fresh connection: the tools pool resets
each returned connection (:mod:`agentlab.core.pools`).
"""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from agentlab import Harness, StrictArgs, Toolset, preset, tool
from agentlab.core.batch import Outcome
from agentlab.core.batch.guard import broken_rule
from agentlab.core.schema import AGENT_ROLE
from agentlab.domains.billing import DOMAIN as BILLING
from agentlab.lab.batches import new_customer, tool_calls
from conftest import fetch

OPENING_CENTS = 5000
OVER_BALANCE_CENTS = 7000
TENANT = "acme"
# each statement a handler may leave behind, and the setting a later batch would otherwise inherit
# The SET forms are refused by the handler guard before they reach the server (agentlab.core.batch.guard);
# set_config(..., false) is the same session setting in a form the guard does not read, which the pool's
# reset must undo.
SESSION_STATEMENTS = {
    "search_path": "SET search_path TO lax, public",
    "search_path_by_function": "SELECT set_config('search_path', 'lax, public', false)",
    "role": f"SET ROLE {AGENT_ROLE}",
    "statement_timeout": "SET statement_timeout = 0",
    "statement_timeout_by_function": "SELECT set_config('statement_timeout', '0', false)",
}
SHOW_SESSION = ("SELECT current_user::text, current_setting('search_path'), current_setting('statement_timeout'),"
                " (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()),"
                " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())")


class UseArchive(StrictArgs):
    """Point this session at the archive before reading it (a user's tool that sets session state). Writes."""

    statement: str


async def use_archive(conn, args, ctx) -> dict:
    await conn.execute(SESSION_STATEMENTS[args["statement"]])
    return {"session": args["statement"]}


class StageCustomers(StrictArgs):
    """Copy the customers into a session's temporary table and hold a session lock (a user's tool). Writes."""

    lock_key: int


async def stage_customers(conn, args, ctx) -> dict:
    # a temporary table named like the business table: pg_temp comes first in every search path
    await conn.execute("CREATE TEMP TABLE customers AS SELECT * FROM public.customers")
    await conn.execute("SELECT pg_advisory_lock(%s)", (args["lock_key"],))
    return {"staged": True}


class ShowSession(StrictArgs):
    """Report the session settings this batch runs with. Reads."""


async def show_session(conn, args, ctx) -> dict:
    user, path, timeout, temp_tables, locks = await (await conn.execute(SHOW_SESSION)).fetchone()
    return {"user": user, "search_path": path, "statement_timeout": timeout, "temp_tables": temp_tables,
            "advisory_locks": locks}


ARCHIVE = dataclasses.replace(
    BILLING, name="archive", toolset=Toolset((*BILLING.toolset.values(), tool(UseArchive, use_archive, writes=True),
                                     tool(StageCustomers, stage_customers, writes=True),
                                     tool(ShowSession, show_session, writes=False))))


CONNECTION_TIMEOUT = "5s"  # the connection's own default (its startup options), not the server's 0


@pytest.fixture
async def one_connection(database_url):
    """A harness for the archive domain whose tools pool holds one connection: every batch gets the same one.
    Its connections start with a statement timeout of their own (``options``), so a handler's 0 would show."""
    url = make_conninfo(database_url, options=f"-c statement_timeout={CONNECTION_TIMEOUT}")
    h = await Harness.open(url, pool_max=1, domain=ARCHIVE)
    try:
        yield h
    finally:
        await h.close()


async def batch(h: Harness, sg_name: str, thread: str, *calls):
    tenant = TENANT if preset(sg_name).isolation else None
    return await h.node(preset(sg_name)).run_batch(tool_calls(*calls, prefix=thread), thread_id=thread,
                                                   tenant_id=tenant)


async def over_balance(h: Harness, sg_name: str, thread: str, customer: int):
    result = await batch(h, sg_name, thread, ("ApplyCredit", {"customer_id": customer, "amount_cents": OVER_BALANCE_CENTS}))
    return result.results[0]


async def credits(h: Harness, customer: int) -> dict[str, int]:
    rows = await fetch(h, "SELECT 'public', credit_cents FROM public.customers WHERE id = %(c)s UNION ALL "
                          "SELECT 'lax', credit_cents FROM lax.customers WHERE id = %(c)s", {"c": customer})
    return dict(rows)


async def test_c44_a_handlers_search_path_does_not_reach_later_batches_under_full_and_ledger(one_connection):
    h = one_connection
    customer = await new_customer(h, OPENING_CENTS)  # one id, in public and in the lax copy
    fresh = {name: await over_balance(h, name, f"c44-fresh-{name}", customer) for name in ("full", "ledger")}
    assert {name: r.outcome for name, r in fresh.items()} == {"full": Outcome.FAILED, "ledger": Outcome.FAILED}

    refused = await batch(h, "full", "c44-archive-set", ("UseArchive", {"statement": "search_path"}))
    assert refused.results[0].outcome is Outcome.FAILED  # the guard refuses a session SET by name
    assert "leaves session state" in refused.results[0].translation.detail
    polluted = await batch(h, "full", "c44-archive", ("UseArchive", {"statement": "search_path_by_function"}))
    assert polluted.results[0].outcome is Outcome.APPLIED  # committed: a session setting outlives its transaction

    for name in ("ledger", "full"):
        later = await over_balance(h, name, f"c44-later-{name}", customer)
        assert (later.outcome, later.content) == (Outcome.FAILED, fresh[name].content), name
    assert await credits(h, customer) == {"public": OPENING_CENTS, "lax": OPENING_CENTS}  # the lax copy untouched
    assert await fetch(h, "SELECT count(*) FROM tool_executions WHERE tool_name = 'ApplyCredit'") == [(0,)]


@pytest.mark.parametrize("statement", list(SESSION_STATEMENTS))
async def test_c44_each_session_setting_a_handler_leaves_is_gone_at_the_next_batch(one_connection, statement):
    h = one_connection
    fresh = (await batch(h, "ledger", f"c44-show-before-{statement}", ("ShowSession", {}))).results[0].result
    assert fresh["statement_timeout"] == CONNECTION_TIMEOUT

    # left under full (the agent role, the thread's tenant, timeouts: all set locally), seen under ledger (none)
    left = await batch(h, "full", f"c44-set-{statement}", ("UseArchive", {"statement": statement}))
    guarded = broken_rule(SESSION_STATEMENTS[statement]) is not None  # refused before it reaches the server
    assert left.results[0].outcome is (Outcome.FAILED if guarded else Outcome.APPLIED)
    later = (await batch(h, "ledger", f"c44-show-after-{statement}", ("ShowSession", {}))).results[0].result
    assert later == fresh


async def test_c44_a_handlers_temporary_table_and_session_lock_do_not_outlive_its_batch(one_connection):
    h = one_connection
    customer = await new_customer(h, OPENING_CENTS)
    key = 4_400_044
    staged = await batch(h, "ledger", "c44-stage", ("StageCustomers", {"lock_key": key}))
    assert staged.results[0].outcome is Outcome.APPLIED

    later = await over_balance(h, "ledger", "c44-after-stage", customer)
    assert later.outcome is Outcome.FAILED  # the CHECK of public.customers, not a temporary copy without it
    shown = (await batch(h, "ledger", "c44-show-stage", ("ShowSession", {}))).results[0].result
    assert (shown["temp_tables"], shown["advisory_locks"]) == (0, 0)
    assert await credits(h, customer) == {"public": OPENING_CENTS, "lax": OPENING_CENTS}
    async with await psycopg.AsyncConnection.connect(h.url, autocommit=True) as other:  # the lock is free
        assert await (await other.execute("SELECT pg_try_advisory_lock(%s)", (key,))).fetchone() == (True,)
