"""C52: on a room's server an attendee's databases are reachable by that attendee (and the instructor, a
superuser) only; another attendee is refused at CONNECT, whichever command made the database."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest

from agentlab.runtime import db
from agentlab.runtime.harness import Harness
from tests.room import room_fixture  # noqa: F401 (the shared_room fixture)

PRIVILEGES = """
SELECT has_database_privilege(%(other)s, d.oid, 'CONNECT'), has_database_privilege(%(own)s, d.oid, 'CONNECT'),
       has_database_privilege('agentlab_agent', d.oid, 'CONNECT')
FROM pg_database d WHERE d.datname = %(name)s
"""


def _refused(room, n: int, dbname: str) -> str:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(db.with_dbname(room.url(n), dbname), connect_timeout=5).close()
    return str(caught.value)


async def test_c52_other_attendee_is_refused_a_notebook_database(shared_room):
    shared_room.as_attendee(1)
    h = await Harness.open(purpose="nb00")
    try:
        name = db.dbname_of(h.url)
        assert shared_room.query(PRIVILEGES, {"other": shared_room.role(2), "own": shared_room.role(1),
                                              "name": name}) == [(False, True, True)]
        assert "permission denied for database" in _refused(shared_room, 2, name)
        with psycopg.connect(db.with_dbname(shared_room.admin, name)) as conn:  # the instructor still reads it
            assert conn.execute("SELECT count(*) FROM customers").fetchone()[0] > 0
    finally:
        await h.close()


def test_c52_database_kept_by_the_demo_command_is_private(shared_room):
    done = shared_room.cli(1, "demo", "--keep")
    assert done.returncode == 0, done.stderr
    kept = [r[0] for r in shared_room.query(
        "SELECT datname FROM pg_database WHERE datdba = (SELECT oid FROM pg_roles WHERE rolname = %s) "
        "AND NOT datistemplate", (shared_room.role(1),))]
    assert kept
    for name in kept:
        assert shared_room.query(PRIVILEGES, {"other": shared_room.role(2), "own": shared_room.role(1),
                                              "name": name}) == [(False, True, True)]
        assert "permission denied for database" in _refused(shared_room, 2, name)


def test_c52_database_of_an_experiment_is_private_while_it_runs(shared_room):
    """An experiment's database (run_experiment, as `chaos` runs it) is polled while it runs: from the moment a
    session is connected to it (the kit connects only once ``keep_private`` has closed it; between its CREATE and
    that one transaction nobody is in it), its privileges are its owner's and the agent role's alone."""
    from agentlab.lab.experiments import run_experiment

    shared_room.as_attendee(2)
    seen: dict[str, tuple] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.02):
            for (name,) in shared_room.query(
                    "SELECT datname FROM pg_database d WHERE datdba = (SELECT oid FROM pg_roles WHERE rolname = %s) "
                    "AND NOT datistemplate AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)",
                    (shared_room.role(2),)):
                rows = shared_room.query(PRIVILEGES, {"other": shared_room.role(1), "own": shared_room.role(2),
                                                      "name": name})
                if rows and name not in seen:  # gone again between the two reads: nothing to see
                    seen[name] = rows[0]

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        result = asyncio.run(run_experiment(1, ["full"], ["none", "crash_mid_node"], seed=0, concurrency=2,
                                            progress=False))
    finally:
        stop.set()
        watcher.join()
    assert len(result.rows) == 2
    assert seen and all(p == (False, True, True) for p in seen.values()), seen
