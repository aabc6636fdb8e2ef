"""Case C11: the checkpointer gets its own autocommit pool with dict rows, never the tools' connection."""

from __future__ import annotations

import secrets

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg import sql
from psycopg.rows import dict_row

from agentlab.runtime import db
from agentlab.runtime.harness import Harness


@pytest.fixture
def bare_database_url():
    """A database without the checkpointer's tables (plain template0)."""
    name = f"agentlab_test_bare_{secrets.token_hex(4)}"
    with db.admin_connection() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    yield db.with_dbname(db.server_url(), name)
    db.drop_database(name)


def test_c11_setup_on_a_non_autocommit_connection_fails(bare_database_url):
    with psycopg.connect(bare_database_url, row_factory=dict_row) as conn:  # autocommit off
        with pytest.raises(psycopg.errors.ActiveSqlTransaction):
            PostgresSaver(conn).setup()  # CREATE INDEX CONCURRENTLY cannot run in a transaction block


def test_c11_setup_on_the_kits_kind_of_connection_works(bare_database_url):
    with psycopg.connect(bare_database_url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()
        assert conn.execute("SELECT count(*) AS n FROM checkpoint_migrations").fetchone()["n"] > 0


@pytest.mark.parametrize("behind_pooler,threshold", [(False, 0), (True, None)])
async def test_c11_the_checkpointer_has_its_own_autocommit_dict_row_pool(database_url, behind_pooler, threshold):
    h = await Harness.open(database_url, behind_pooler=behind_pooler)
    try:
        assert h.saver.conn is h.checkpointer_pool and h.checkpointer_pool is not h.pool
        async with h.checkpointer_pool.connection() as conn:
            assert conn.autocommit is True
            assert conn.row_factory is dict_row
            assert conn.prepare_threshold == threshold
        async with h.pool.connection() as conn:  # the tools' pool too: a pooler cannot keep prepared statements
            assert conn.prepare_threshold == (None if behind_pooler else 5)
        ep = await h.run_episode("invoice", "full", thread_id=f"t-c11-{behind_pooler}")
        assert ep.error is None and not ep.unanswered
        tuple_ = await h.saver.aget_tuple({"configurable": {"thread_id": ep.thread_id}})
        assert tuple_ is not None and len(tuple_.checkpoint["channel_values"]["messages"]) == len(ep.messages)
    finally:
        await h.close()


async def test_resume_in_a_new_harness_sees_the_same_thread(database_url):
    h1 = await Harness.open(database_url)
    ep = await h1.run_episode("refund", "full", thread_id="t-c11-resume")
    await h1.close()
    h2 = await Harness.open(database_url)  # new pools, as after a restart
    try:
        tuple_ = await h2.saver.aget_tuple({"configurable": {"thread_id": "t-c11-resume"}})
        messages = tuple_.checkpoint["channel_values"]["messages"]
        assert [type(m).__name__ for m in messages] == [type(m).__name__ for m in ep.messages]
        assert isinstance(messages[0], HumanMessage)
    finally:
        await h2.close()
