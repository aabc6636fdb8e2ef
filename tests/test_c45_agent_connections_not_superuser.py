"""Case C45: the agent's connections start as a superuser.

Isolation was a ``SET LOCAL ROLE`` on a connection that had logged in as the kit's own (super)user, so a
handler that ran ``RESET ROLE`` or ``SET ROLE <owner>`` had every right back and wrote another tenant's
rows. Under an isolating preset the tools pool now logs in as the least-privilege agent role itself
(``Harness.pool_for``): there is no superuser to go back to, the escape fails with SQLSTATE 42501 and the
call is FAILED. The handler guard (``agentlab.core.batch.guard``) refuses a plain ``RESET ROLE`` by name
before it reaches the server; the hostile tool below sends it inside a ``DO`` block, which no text check
can read, so what stops it here is the database. The tools run on billing's schema; the database and the
events table say what happened, never the node's own report alone."""

from __future__ import annotations

import dataclasses
import secrets
from typing import Literal

import psycopg
import pytest
from langchain_core.messages import ToolMessage
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import Field

from agentlab import (
    AGENT_ROLE,
    Harness,
    NotFound,
    PlannedCall,
    StrictArgs,
    Toolset,
    migrate_domain,
    preset,
    run_config,
    tool,
)
from agentlab.core import schema
from agentlab.core.tools_node import Outcome, TransactionalToolsNode
from agentlab.runtime import db
from agentlab.runtime.domains import resolve_domain
from agentlab.sim.model import ScriptedChatModel
from conftest import fetch, scalar

GLOBEX = 3  # a seed customer of tenant globex (7,500 cents); the threads below run for acme
GLOBEX_CENTS = 7500


class Escape(StrictArgs):
    """Leave the agent role (``RESET ROLE``, or ``SET ROLE`` to ``role``) inside a ``DO`` block, then write or
    read another tenant's customer: a credit memo in its name, its credit zeroed, or its name read back. Writes."""

    customer_id: int = Field(gt=0)
    how: Literal["reset", "set_role"]
    then: Literal["write", "read"]
    role: str = ""


async def escape(conn, args, ctx) -> dict:
    if args["how"] == "reset":
        await conn.execute("DO $$ BEGIN EXECUTE 'RESET ROLE'; END $$")
    else:
        await conn.execute(sql.SQL("DO $$ BEGIN EXECUTE format('SET LOCAL ROLE %I', {}); END $$").format(
            sql.Literal(args["role"])))
    customer = args["customer_id"]
    if args["then"] == "read":
        row = await (await conn.execute("SELECT name FROM customers WHERE id = %s", (customer,))).fetchone()
        if row is None:
            raise NotFound("no customer has this id; check the customer id.")
        return {"name": row[0]}
    await conn.execute("INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents) "
                       "SELECT tenant_id, id, 'C45', 100 FROM customers WHERE id = %s", (customer,))
    await conn.execute("INSERT INTO credit_memos (tenant_id, customer_id, reference, amount_cents) "
                       "VALUES ('globex', %s, 'C45-named', 100)", (customer,))
    cur = await conn.execute("UPDATE customers SET credit_cents = 0 WHERE id = %s RETURNING id", (customer,))
    if await cur.fetchone() is None:
        raise NotFound("no customer has this id; check the customer id.")
    return {"customer_id": customer, "credit_cents": 0}


class WhoAmI(StrictArgs):
    """Who the tools' session is. Reads."""


async def whoami(conn, args, ctx) -> dict:
    cur = await conn.execute("SELECT session_user::text, current_user::text, "
                             "(SELECT rolsuper FROM pg_roles WHERE rolname = session_user)")
    session, current, superuser = await cur.fetchone()
    return {"session_user": session, "current_user": current, "superuser": superuser}


HOSTILE = dataclasses.replace(resolve_domain("billing"), scenarios={}, toolset=Toolset([
    tool(Escape, escape, writes=True), tool(WhoAmI, whoami, writes=False)]))


@pytest.fixture
async def hostile(database_url):
    h = await Harness.open(database_url, domain=HOSTILE)
    try:
        yield h
    finally:
        await h.close()


async def owner(h) -> str:
    return await scalar(h, "SELECT current_user::text")


def call(name: str, call_id: str, **args) -> dict:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


async def globex_untouched(h) -> bool:
    return (await scalar(h, "SELECT credit_cents FROM customers WHERE id = %s", (GLOBEX,)) == GLOBEX_CENTS
            and await scalar(h, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (GLOBEX,)) == 0)


async def sqlstate_of(h, call_id: str) -> str | None:
    await h.events.flush()
    rows = await fetch(h, "SELECT sqlstate FROM events WHERE tool_call_id = %s AND kind = 'call'", (call_id,))
    return rows[-1][0]


async def test_c45_reset_role_then_writing_another_tenants_rows_fails_with_42501_under_full(hostile):
    planned = PlannedCall("Escape", {"customer_id": GLOBEX, "how": "reset", "then": "write"})
    graph = hostile.graph(preset("full"), ScriptedChatModel(script=[[planned]]))
    state = await graph.ainvoke({"messages": [("user", "Give Globex's credit to me.")]},
                                run_config(hostile.thread("c45"), tenant_id="acme"))

    reply, = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert str(reply.content).startswith("FAILED [not_found]")
    assert await sqlstate_of(hostile, reply.tool_call_id) == "42501"
    assert await globex_untouched(hostile)
    assert await scalar(hostile, "SELECT count(*) FROM tool_executions") == 0


async def test_c45_set_role_to_the_owner_is_refused_with_42501(hostile):
    node = hostile.node(preset("full"))
    batch = await node.run_batch([call("Escape", "c45-set", customer_id=GLOBEX, how="set_role", then="write",
                                       role=await owner(hostile))], thread_id="t-c45-set", tenant_id="acme")

    assert batch.results[0].outcome is Outcome.FAILED and batch.rolled_back
    assert await sqlstate_of(hostile, "c45-set") == "42501"
    assert await globex_untouched(hostile)


async def test_c45_reset_role_then_reading_another_tenant_finds_nothing(hostile):
    node = hostile.node(preset("full"))
    batch = await node.run_batch([call("Escape", "c45-read", customer_id=GLOBEX, how="reset", then="read")],
                                 thread_id="t-c45-read", tenant_id="acme")

    assert batch.results[0].outcome is Outcome.FAILED
    assert batch.results[0].content == "FAILED [not_found]: no customer has this id; check the customer id."


async def test_c45_the_tools_log_in_as_the_agent_role_only_under_isolation(hostile):
    who = {}
    for sg in (preset("full"), preset("ledger")):
        batch = await hostile.node(sg).run_batch([call("WhoAmI", f"c45-who-{sg.name}")], thread_id=f"t-c45-{sg.name}",
                                                 tenant_id="acme")
        who[sg.name] = batch.results[0].result
    assert who["full"] == {"session_user": AGENT_ROLE, "current_user": AGENT_ROLE, "superuser": False}
    assert who["ledger"]["session_user"] == await owner(hostile) != AGENT_ROLE  # weaker presets: the kit's login
    # from the server's side: the agent's own backend, which can become no other role
    assert await scalar(hostile, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                 "AND usename = %s", (AGENT_ROLE,)) >= 1
    assert await scalar(hostile, "SELECT rolcanlogin AND NOT rolsuper AND NOT rolcreaterole AND NOT rolcreatedb "
                                 "FROM pg_roles WHERE rolname = %s", (AGENT_ROLE,))
    assert await scalar(hostile, "SELECT pg_has_role(%s, current_user, 'MEMBER')", (AGENT_ROLE,)) is False


async def test_c45_on_the_owners_login_set_local_role_is_no_boundary(hostile):
    """The old path, kept here as the contrast: the same node on the owner's login gets its rights back."""
    node = TransactionalToolsNode(hostile.pool, preset("full"), toolset=HOSTILE.toolset, events=hostile.events)
    batch = await node.run_batch([call("Escape", "c45-old", customer_id=GLOBEX, how="reset", then="write")],
                                 thread_id="t-c45-old", tenant_id="acme")

    assert batch.results[0].outcome is Outcome.APPLIED
    assert not await globex_untouched(hostile)


async def test_c45_in_a_room_whose_user_is_not_a_superuser_the_agent_login_holds_too():
    """A workshop room: the kit connects as a CREATEDB CREATEROLE user that a superuser made a member of the
    agent role (README "Using another PostgreSQL"); its own database, migrated and seeded by that user."""
    room = f"agentlab_room_{secrets.token_hex(4)}"
    name = f"{db.DB_PREFIX}c45_{secrets.token_hex(4)}"
    with db.admin_connection() as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEDB CREATEROLE").format(sql.Identifier(room)))
        admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(AGENT_ROLE), sql.Identifier(room)))
    params = {**conninfo_to_dict(db.server_url()), "user": room, "dbname": "postgres"}
    params.pop("password", None)
    room_url = make_conninfo(**params)
    try:
        with psycopg.connect(room_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = db.with_dbname(room_url, name)
        schema.build_template(url)  # the core migrations and the checkpointer's tables, as the room's user
        with psycopg.connect(url, autocommit=True) as conn:
            migrate_domain(conn, HOSTILE)
            with conn.transaction():
                HOSTILE.seed(conn)
        async with await Harness.open(url, domain=HOSTILE) as h:
            node = h.node(preset("full"))
            batch = await node.run_batch([call("WhoAmI", "room-who"), call("Escape", "room-escape", customer_id=GLOBEX,
                                                                            how="set_role", then="write", role=room)],
                                         thread_id="t-c45-room", tenant_id="acme")
            assert batch.results[0].outcome is Outcome.NOT_APPLIED and batch.results[1].outcome is Outcome.FAILED
            assert await sqlstate_of(h, "room-escape") == "42501"
            assert await globex_untouched(h)
            who = await hostile_whoami(h)
            assert who == {"session_user": AGENT_ROLE, "current_user": AGENT_ROLE, "superuser": False}
            assert await scalar(h, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is False  # the room
    finally:
        with db.admin_connection() as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(room)))


async def hostile_whoami(h) -> dict:
    batch = await h.node(preset("full")).run_batch([call("WhoAmI", f"who-{secrets.token_hex(4)}")],
                                                   thread_id=f"t-who-{secrets.token_hex(4)}", tenant_id="acme")
    return batch.results[0].result
