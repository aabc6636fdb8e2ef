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
