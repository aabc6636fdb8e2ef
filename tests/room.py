"""A room on the shared PostgreSQL at 127.0.0.1:5432 for the C51-C53 tests: attendee roles made by
:func:`agentlab.runtime.room.setup` under a prefix of their own, dropped with their databases afterwards, and
pollers of ``pg_stat_activity`` that count the connections of the processes under test."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

import psycopg
import pytest

from agentlab.runtime import db, room

SHARED = "postgresql://postgres@127.0.0.1:5432/postgres"
ROOT = Path(__file__).resolve().parent.parent


def shared_or_skip() -> str:
    """The shared server's maintenance URL (superuser), or skip when it does not answer."""
    try:
        psycopg.connect(SHARED, connect_timeout=2).close()
    except psycopg.Error:
        pytest.skip("the shared PostgreSQL at 127.0.0.1:5432 is unreachable")
    return SHARED


@dataclass
class Room:
    admin: str
    prefix: str
    monkeypatch: pytest.MonkeyPatch

    def role(self, n: int) -> str:
        return f"{self.prefix}{n}"

    def url(self, n: int) -> str:
        return f"postgresql://{self.role(n)}@127.0.0.1:5432/postgres"

    def as_attendee(self, n: int) -> None:
        """This process's DATABASE_URL names attendee ``n``, as a spawner sets it for the attendee's kernel."""
        self.monkeypatch.setenv(db.ENV_VAR, self.url(n))

    def query(self, statement: str, params=()) -> list[tuple]:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def cli(self, n: int, *args: str, **env: str) -> subprocess.CompletedProcess:
        full = {**os.environ, db.ENV_VAR: self.url(n), "PYTHONPATH": str(ROOT), **env}
        return subprocess.run([sys.executable, "-m", "agentlab", *args], env=full, capture_output=True, text=True,
                              timeout=300, cwd=ROOT)


@contextlib.contextmanager
def shared_room_of(attendees: int, monkeypatch: pytest.MonkeyPatch, *, budget: int = 10) -> Iterator[Room]:
    """``attendees`` attendees (``budget`` connections each) on the shared server, under a prefix of their own;
    their databases and roles dropped afterwards, also when the setup stopped halfway."""
    admin = shared_or_skip()
    prefix = f"c5room{secrets.token_hex(3)}_a"
    monkeypatch.setenv(db.ENV_VAR, admin)
    monkeypatch.delenv("AGENTLAB_MAX_CONNECTIONS", raising=False)
    try:
        room.setup(attendees, prefix=prefix, budget=budget)
        yield Room(admin, prefix, monkeypatch)
    finally:
        monkeypatch.setenv(db.ENV_VAR, admin)
        room.teardown(prefix=prefix)


@pytest.fixture(name="shared_room")
def room_fixture(monkeypatch):
    """Two attendees (budget 10 each) on the shared server; their databases and roles dropped afterwards."""
    with shared_room_of(2, monkeypatch) as shared:
        yield shared


@dataclass
class _Poller:
    """Calls :meth:`_sample` every ``interval_s`` seconds on one connection to ``admin`` (a superuser's URL), in a
    thread, from the start of the ``with`` block to its end."""

    admin: str
    _: KW_ONLY
    interval_s: float = 0.01
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self):
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            while not self._stop.wait(self.interval_s):
                self._sample(conn)
                self.samples += 1

    def _sample(self, conn: psycopg.Connection) -> None:
        raise NotImplementedError

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class PeakConnections(_Poller):
    """Polls pg_stat_activity every 10 ms (in a thread, on the admin URL) for sessions whose application_name
    is ``app`` (libpq's PGAPPNAME, which every connection of the process under test carries)."""

    app: str
    peak: int = 0

    def _sample(self, conn: psycopg.Connection) -> None:
        n = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (self.app,)).fetchone()[0]
        self.peak = max(self.peak, n)


ROOM_ACTIVITY = """
SELECT a.application_name, a.usename, d.datname, pg_get_userbyid(d.datdba) AS owner
FROM pg_stat_activity a
LEFT JOIN pg_database d ON d.oid = a.datid AND NOT d.datistemplate AND starts_with(d.datname, %(kit)s)
WHERE a.application_name = ANY(%(apps)s)
"""


@dataclass
class RoomActivity(_Poller):
    """:class:`PeakConnections` for several processes at once, each with an application_name of its own in
    ``apps``: the peak of all their sessions together, each one's peak, each role's peak (the agent role's
    logins apart from the attendee's own), and every kit database (not a template) a session was seen in,
    with its owner."""

    apps: tuple[str, ...]
    peak: int = 0
    peaks: dict[str, int] = field(default_factory=dict)  # application_name -> its peak
    role_peaks: dict[tuple[str, str], int] = field(default_factory=dict)  # (application_name, role) -> peak
    databases: set[tuple[str, str, str]] = field(default_factory=set)  # (application_name, database, owner)
    together: int = 0  # the most of ``apps`` seen connected in one sample

    def _sample(self, conn: psycopg.Connection) -> None:
        rows = conn.execute(ROOM_ACTIVITY, {"kit": db.DB_PREFIX, "apps": list(self.apps)}).fetchall()
        self.peak = max(self.peak, len(rows))
        per_app = Counter(row[0] for row in rows)
        self.together = max(self.together, len(per_app))
        for app, n in per_app.items():
            self.peaks[app] = max(self.peaks.get(app, 0), n)
        for key, n in Counter((app, role) for app, role, _, _ in rows).items():
            self.role_peaks[key] = max(self.role_peaks.get(key, 0), n)
        self.databases |= {(app, name, owner) for app, _, name, owner in rows if name is not None}
