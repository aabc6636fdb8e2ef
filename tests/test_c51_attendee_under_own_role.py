"""C51: an attendee under a role of their own (LOGIN CREATEDB, no superuser) runs the notebooks after one room
setup; a right that is missing is named with the statement that needs it."""

from __future__ import annotations

import json

import psycopg
import pytest

from agentlab.runtime import db
from agentlab.runtime.harness import Harness
from agentlab.runtime.notebook import open_notebook
from tests.room import room_fixture  # noqa: F401 (the shared_room fixture)


async def _whoami(h: Harness) -> tuple[str, bool]:
    async with h.pool.connection() as conn:
        cur = await conn.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")
        return await cur.fetchone()


async def test_c51_notebook_first_cell_runs_as_the_attendee(shared_room):
    shared_room.as_attendee(1)
    h = await open_notebook("00")
    try:
        assert await _whoami(h) == (shared_room.role(1), False)
        await h.saver.aget_tuple({"configurable": {"thread_id": "c51", "checkpoint_ns": ""}})  # the table C51 failed on
        dbname = db.dbname_of(h.url)
    finally:
        await h.close()
    owners = shared_room.query("SELECT datname FROM pg_database WHERE datname = %s", (dbname,))
    assert owners == []  # closed: dropped by its owner, the attendee


async def test_c51_harness_open_for_retail_owns_every_table_through_the_database(shared_room):
    shared_room.as_attendee(2)
    h = await Harness.open(purpose="c51", domain="retail", keep=True)
    try:
        assert await _whoami(h) == (shared_room.role(2), False)
        async with h.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE NOT has_table_privilege(c.oid, 'SELECT, INSERT, UPDATE, DELETE')), "
                "count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind = 'r' AND n.nspname IN ('public', 'retail', 'runs')")
            refused, tables = await cur.fetchone()
        assert tables > 0 and refused == 0
    finally:
        await h.close()
    dbname = db.dbname_of(h.url)
    assert shared_room.query("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s",
                             (dbname,)) == [(shared_room.role(2),)]


def test_c51_demo_command_line_as_the_attendee(shared_room):
    done = shared_room.cli(1, "demo", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)


def test_c51_missing_right_names_the_right_and_the_statement(shared_room, monkeypatch):
    role = shared_room.role(9)
    shared_room.query(f'CREATE ROLE "{role}" LOGIN')  # no CREATEDB
    try:
        monkeypatch.setenv(db.ENV_VAR, shared_room.url(9))
        with pytest.raises(db.DatabaseUnavailable) as caught:
            db.create_database("c51")
        text = str(caught.value)
        assert role in text and "CREATEDB" in text and "CREATE DATABASE" in text and "room setup" in text
        assert shared_room.query("SELECT rolcreatedb FROM pg_roles WHERE rolname = %s", (role,)) == [(False,)]
    finally:
        shared_room.query(f'DROP ROLE "{role}"')


def test_c51_create_role_refusal_names_createrole():
    exc = psycopg.errors.InsufficientPrivilege("permission denied to create role")
    text = db.missing_right(exc, "building the template database agentlab_tpl_x")
    assert "CREATEROLE" in text and "CREATE ROLE agentlab_agent" in text and "needs CREATEDB" not in text


async def test_c51_room_sql_run_by_hand_makes_the_same_room(shared_room, monkeypatch):
    """The instructor who runs `room sql`'s output by hand (psql) gets the roles `room setup` makes."""
    from agentlab.runtime import room

    prefix = f"{shared_room.prefix}h"
    script = room.render(1, prefix=prefix, budget=7)
    try:
        with psycopg.connect(shared_room.admin, autocommit=True) as conn:
            conn.execute(script)
        role = f"{prefix}1"
        assert shared_room.query(
            "SELECT rolcreatedb, rolsuper, rolcanlogin, rolconnlimit, pg_has_role(rolname, 'agentlab_agent', 'MEMBER'),"
            " pg_has_role(rolname, 'agentlab_agent', 'USAGE') FROM pg_roles WHERE rolname = %s",
            (role,)) == [(True, False, True, 7, True, False)]  # may SET ROLE to the agent, inherits none of its rights
        monkeypatch.setenv(db.ENV_VAR, f"postgresql://{role}@127.0.0.1:5432/postgres")
        h = await Harness.open(purpose="c51")
        try:
            assert await _whoami(h) == (role, False)
        finally:
            await h.close()
    finally:
        monkeypatch.setenv(db.ENV_VAR, shared_room.admin)
        room.teardown(prefix=prefix)
    assert shared_room.query("SELECT 1 FROM pg_roles WHERE rolname = %s", (f"{prefix}1",)) == []
