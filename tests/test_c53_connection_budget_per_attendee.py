"""C53: one setting, AGENTLAB_MAX_CONNECTIONS, keeps a notebook's pools and experiments within an attendee's
connection budget; a role's connection limit is reported as a role limit, never as a lost server."""

from __future__ import annotations

import asyncio
import secrets

import psycopg
import pytest

from agentlab.core import budget
from agentlab.runtime import db
from agentlab.runtime.harness import Harness
from tests.room import PeakConnections, room_fixture  # noqa: F401 (the shared_room fixture)

BUDGET = 6


def _experiment(**kwargs):
    from agentlab.lab.experiments import run_experiment

    return asyncio.run(run_experiment(2, ["naive", "full"], ["none", "crash_mid_node", "backend_killed"], seed=0,
                                      progress=False, **kwargs))


async def test_c53_role_limit_is_reported_as_a_role_limit(shared_room):
    role = shared_room.role(1)
    shared_room.query(f'ALTER ROLE "{role}" CONNECTION LIMIT 2')
    held = [psycopg.connect(shared_room.url(1)) for _ in range(2)]  # the attendee's other two sessions
    try:
        shared_room.as_attendee(1)
        with pytest.raises(db.ConnectionLimitReached) as caught:
            await Harness.open(purpose="c53")
    finally:
        for conn in held:
            conn.close()
    text = str(caught.value)
    assert "too many connections for role" in text and role in text and budget.ENV_VAR in text
    assert "lost the database server" not in text
    assert shared_room.query("SELECT rolconnlimit FROM pg_roles WHERE rolname = %s", (role,)) == [(2,)]


def test_c53_role_limit_from_the_command_line(shared_room):
    role = shared_room.role(2)
    shared_room.query(f'ALTER ROLE "{role}" CONNECTION LIMIT 1')
    with psycopg.connect(shared_room.url(2)):  # the one connection the role may hold
        done = shared_room.cli(2, "demo")
    assert done.returncode == 2
    assert "connection limit" in done.stderr and budget.ENV_VAR in done.stderr and "lost" not in done.stderr


def test_c53_budget_bounds_an_experiment_under_the_role_limit(shared_room, monkeypatch):
    """Concurrency 32 and two worker processes asked for; the budget wins, and the role limit is never hit."""
    app = f"c53_{secrets.token_hex(3)}"
    shared_room.query(f'ALTER ROLE "{shared_room.role(1)}" CONNECTION LIMIT {BUDGET}')
    shared_room.as_attendee(1)
    monkeypatch.setenv(budget.ENV_VAR, str(BUDGET))
    monkeypatch.setenv("PGAPPNAME", app)
    with PeakConnections(shared_room.admin, app) as seen:
        result = _experiment(concurrency=32, workers=2)
    assert len(result.rows) == 12 and result.workers == 1
    assert seen.samples > 0 and 0 < seen.peak <= BUDGET, seen


@pytest.mark.slow
def test_c53_budget_bounds_an_experiment_on_the_embedded_server(monkeypatch):
    """No room, no role limit: the kit's own server, the same setting, the same bound."""
    if db.server().embedded is False:
        pytest.skip("DATABASE_URL is set: this variant is about the embedded server")
    app = f"c53_{secrets.token_hex(3)}"
    monkeypatch.setenv(budget.ENV_VAR, str(BUDGET))
    monkeypatch.setenv("PGAPPNAME", app)
    with PeakConnections(db.server_url(), app) as seen:
        result = _experiment(concurrency=32)
    assert len(result.rows) == 12
    assert seen.samples > 0 and 0 < seen.peak <= BUDGET, seen


def test_c53_unset_budget_changes_nothing_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.delenv(budget.ENV_VAR, raising=False)
    assert budget.capped(32) == 32 and budget.pool_cap() is None
    for bad in ("seven", "0", str(budget.MIN_BUDGET - 1)):
        monkeypatch.setenv(budget.ENV_VAR, bad)
        with pytest.raises(budget.BudgetSettingInvalid, match=budget.ENV_VAR):
            budget.connection_budget()
    monkeypatch.setenv(budget.ENV_VAR, str(budget.MIN_BUDGET))
    assert budget.pooled_slots() == budget.MIN_BUDGET - budget.RESERVED and budget.capped(32) == 1


@pytest.mark.slow
def test_c53_chaos_at_the_role_limit_without_the_setting_names_the_limit(shared_room):
    """Notebook 09's way in (an experiment), budget unset: its pools fill the role's limit; the error is the
    limit's, with the setting to lower, where it was a bare PoolTimeout or "lost the database server"."""
    role = shared_room.role(1)
    shared_room.query(f'ALTER ROLE "{role}" CONNECTION LIMIT 4')
    done = shared_room.cli(1, "chaos", "--episodes", "1", "--faults", "none", "--presets", "full", "--no-progress",
                           AGENTLAB_MAX_CONNECTIONS="")
    assert done.returncode == 2, done.stderr
    assert "connection limit" in done.stderr and budget.ENV_VAR in done.stderr and "lost" not in done.stderr
    shared_room.query(f'ALTER ROLE "{role}" CONNECTION LIMIT 7')  # the C53 limit: within it at the setting's least
    done = shared_room.cli(1, "chaos", "--episodes", "1", "--faults", "none", "--presets", "full", "--no-progress",
                           AGENTLAB_MAX_CONNECTIONS=str(budget.MIN_BUDGET))
    assert done.returncode == 0, done.stderr
