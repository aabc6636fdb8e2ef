"""Shared fixtures: every test gets its own fresh database on the server in use.

The server is ``DATABASE_URL`` when set, else the embedded one (see ``agentlab.runtime.db``). Databases are
created from the migrated template (tens of milliseconds) and dropped after the test.
"""

from __future__ import annotations

import logging

import pytest

from agentlab.runtime import db
from agentlab.runtime.harness import Harness


@pytest.fixture(scope="session", autouse=True)
def _server():
    """Start (or reach) the server and build the template once per session; fail with one clear line."""
    try:
        db.ensure_template()
    except db.DatabaseUnavailable as exc:
        pytest.exit(f"agentlab tests need a database: {exc}", returncode=2)


@pytest.fixture
def database_url():
    """Conninfo of a fresh database, dropped after the test."""
    url = db.create_database("test")
    yield url
    db.drop_database(url)


@pytest.fixture
async def harness(database_url):
    """A :class:`Harness` on the test's fresh database."""
    h = await Harness.open(database_url)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture(autouse=True)
def _quiet_events(caplog):
    caplog.set_level(logging.INFO, logger="agentlab.core.events")
    yield


async def fetch(h: Harness, query: str, params=()) -> list[tuple]:
    """All rows of ``query`` on the harness's database (a helper for assertions)."""
    async with h.pool.connection() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def scalar(h: Harness, query: str, params=()):
    rows = await fetch(h, query, params)
    return rows[0][0] if rows else None


class TurnModel:
    """Builds a LangChain chat model that answers by the number of AIMessages already in the history:
    reply ``n`` is ``turns[n](messages)`` (an AIMessage, or a callable of the history giving one), and a
    plain "done." once the turns run out. Deterministic from the history alone, so a resumed thread
    continues where it stopped. For tool call shapes the scripted model never sends (no id, invalid
    JSON, one id on every turn)."""

    def __new__(cls, turns):
        from langchain_core.language_models.chat_models import BaseChatModel
        from langchain_core.messages import AIMessage
        from langchain_core.outputs import ChatGeneration, ChatResult

        class _TurnModel(BaseChatModel):
            turns: list
            calls: int = 0

            @property
            def _llm_type(self) -> str:
                return "agentlab-test-turns"

            def bind_tools(self, tools, **kwargs):
                return self

            def _generate(self, messages, stop=None, run_manager=None, **kwargs):
                self.calls += 1
                n = sum(isinstance(m, AIMessage) for m in messages)
                reply = self.turns[n] if n < len(self.turns) else AIMessage("done.")
                reply = reply(messages) if callable(reply) else reply.model_copy(deep=True)
                reply.id = None  # a fresh run id per call, as a provider's response has
                return ChatResult(generations=[ChatGeneration(message=reply)])

        return _TurnModel(turns=list(turns))
