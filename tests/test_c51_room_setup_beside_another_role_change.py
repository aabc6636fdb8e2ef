"""C51, the same kind at another moment: roles are cluster-wide, so a room's setup can meet another session
changing the same role (a second room set up at once, a kit database's migration letting the agent role log
in, an instructor's ALTER ROLE). PostgreSQL makes the later ALTER wait for the other transaction and then
refuses it with "tuple concurrently updated" (XX000); the setup must go on and leave the room it was asked
for. Each test holds the other session's change open until the setup is seen waiting on it (pg_stat_activity),
then commits it: the race happens every run, not by chance."""

from __future__ import annotations

import secrets
import threading

import psycopg
import pytest

from agentlab.core.schema import AGENT_ROLE
from agentlab.runtime import db, room
from tests.room import shared_or_skip

WAIT_S = 120


def _wait_until_blocked(admin: str, other_pid: int, setup: threading.Thread) -> None:
    """Return once some session waits on ``other_pid``'s transaction (``pg_blocking_pids``); fail if the setup
    ended first."""
    with psycopg.connect(admin, autocommit=True) as conn:
        while setup.is_alive():
            blocked = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                   (other_pid,)).fetchone()[0]
            if blocked:
                return
            setup.join(0.01)
    pytest.fail("the setup ended before it met the other session's change")


class SetupThread(threading.Thread):
    """``room.setup`` in a thread; what it raised is kept in ``error``."""

    def __init__(self, prefix: str, budget: int) -> None:
        super().__init__(daemon=True)
        self.prefix, self.budget = prefix, budget
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            room.setup(2, prefix=self.prefix, budget=self.budget)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc


def _limits(admin: str, prefix: str) -> dict[str, int]:
    with psycopg.connect(admin, autocommit=True) as conn:
        return dict(conn.execute("SELECT rolname, rolconnlimit FROM pg_roles WHERE rolname LIKE %s ORDER BY 1",
                                 (prefix + "%",)).fetchall())


def _hold(conn: psycopg.Connection, statement: str) -> None:
    """Run ``statement`` in ``conn``'s open transaction, again while another test's room setup changes the
    same role at that moment (the race this file is about, met by the other session here)."""
    for _ in range(100):
        try:
            conn.execute(statement)
            return
        except psycopg.errors.InternalError_:
            conn.rollback()
    pytest.fail(f"{statement!r} met a concurrent change 100 times")


def _race(admin: str, prefix: str, budget: int, statement: str) -> SetupThread:
    """Hold ``statement`` open in another session, run the setup into it, commit once the setup waits."""
    other = psycopg.connect(admin)
    try:
        _hold(other, statement)
        setup = SetupThread(prefix, budget)
        setup.start()
        _wait_until_blocked(admin, other.info.backend_pid, setup)
        other.commit()
    finally:
        other.close()
    setup.join(WAIT_S)
    assert not setup.is_alive()
    return setup


@pytest.fixture(name="admin")
def admin_fixture(monkeypatch):
    admin = shared_or_skip()
    monkeypatch.setenv(db.ENV_VAR, admin)
    monkeypatch.delenv("AGENTLAB_MAX_CONNECTIONS", raising=False)
    return admin


def _setup_through(admin: str, prefix: str, budget: int, statement: str) -> dict[str, int]:
    """Set up ``prefix``'s room of two through ``statement`` held open by another session; the roles' limits."""
    setup = _race(admin, prefix, budget, statement)
    assert setup.error is None, f"setup raised {setup.error!r}"
    return _limits(admin, prefix)


def test_c51_room_setup_survives_a_concurrent_change_of_the_agent_role(admin):
    prefix = f"c5race{secrets.token_hex(3)}_a"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(room.ensure_role(AGENT_ROLE, "LOGIN"))
    try:
        assert _setup_through(admin, prefix, 10, f"ALTER ROLE {AGENT_ROLE} LOGIN") == {f"{prefix}1": 10, f"{prefix}2": 10}
    finally:
        room.teardown(prefix=prefix)


def test_c51_room_set_up_again_while_an_attendee_role_is_changed_keeps_the_new_budget(admin):
    prefix = f"c5race{secrets.token_hex(3)}_b"
    room.setup(2, prefix=prefix, budget=10)
    try:
        # the instructor's change commits first; the setup asked for 12 runs after it and holds
        assert (_setup_through(admin, prefix, 12, f"ALTER ROLE {prefix}1 CONNECTION LIMIT 3")
                == {f"{prefix}1": 12, f"{prefix}2": 12})
    finally:
        room.teardown(prefix=prefix)


def _at_once(*calls) -> list[BaseException]:
    """Run each ``(function, kwargs)`` in a thread of its own, released together; what they raised."""
    start = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def run(fn, kwargs) -> None:
        start.wait()
        try:
            fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    return errors


def test_c51_two_rooms_set_up_at_once_both_stand(admin):
    prefixes = [f"c5race{secrets.token_hex(3)}_c", f"c5race{secrets.token_hex(3)}_d"]
    try:
        assert _at_once(*[(room.setup, {"attendees": 2, "prefix": p, "budget": 10}) for p in prefixes]) == []
        for p in prefixes:
            assert _limits(admin, p) == {f"{p}1": 10, f"{p}2": 10}
    finally:
        for p in prefixes:
            room.teardown(prefix=p)


def test_c51_room_torn_down_while_another_is_set_up_leaves_the_new_one_whole(admin):
    """The last room's teardown drops the shared room role; a setup at the same moment must still end with
    its attendees members of it (setup and teardown take turns on one advisory lock)."""
    old, new = f"c5race{secrets.token_hex(3)}_e", f"c5race{secrets.token_hex(3)}_f"
    room.setup(1, prefix=old, budget=10)
    try:
        assert _at_once((room.teardown, {"prefix": old}),
                        (room.setup, {"attendees": 2, "prefix": new, "budget": 10})) == []
        with psycopg.connect(admin, autocommit=True) as conn:
            members = conn.execute(room.ROOM_ROLES, (room.ROOM_ROLE, f"^{new}[0-9]+$")).fetchall()
        assert [m[0] for m in members] == [f"{new}1", f"{new}2"]
        assert _limits(admin, old) == {}
    finally:
        room.teardown(prefix=new)
