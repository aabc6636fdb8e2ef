"""A room on one server: a role per attendee, each attendee's databases private, a connection budget each.

``python -m agentlab room setup --attendees N`` (as a superuser, ``DATABASE_URL`` naming the server) runs
:func:`room_sql` and builds the templates; ``room sql`` prints the same SQL for an instructor who runs it by
hand; ``room teardown`` drops the attendees' databases and roles. What it makes (cases C51-C53):

- :data:`agentlab.core.agent_role.AGENT_ROLE`, the cluster-wide agent role (``LOGIN``: the tools pool logs in as
  it), made here so that no attendee needs ``CREATEROLE``;
- :data:`ROOM_ROLE`, ``NOLOGIN NOINHERIT``, a member of the agent role: its members may ``SET ROLE`` to the
  agent role but do not inherit its rights (its ``CONNECT`` on every attendee's database above all);
- ``attendee1`` ... ``attendeeN``: ``LOGIN CREATEDB CONNECTION LIMIT <budget>``, members of :data:`ROOM_ROLE`.

The templates' objects belong to ``pg_database_owner`` (:func:`agentlab.runtime.db.hand_to_database_owner`),
so in each attendee's copy they belong to that attendee; each copy is private to its owner
(:func:`agentlab.runtime.db.keep_private`). The budget is the role's connection limit; the kernel's
``AGENTLAB_MAX_CONNECTIONS`` (:mod:`agentlab.core.budget`) keeps each notebook within it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time

import psycopg
from psycopg import sql

from agentlab.core.agent_role import AGENT_ROLE
from agentlab.core.budget import ENV_VAR as BUDGET_ENV
from agentlab.core.budget import MIN_BUDGET
from agentlab.runtime import db
from agentlab.runtime.databases import database_rows

log = logging.getLogger(__name__)

ROOM_ROLE = "agentlab_room"
DEFAULT_PREFIX = "attendee"
DEFAULT_BUDGET = 10  # connections per attendee: a notebook under AGENTLAB_MAX_CONNECTIONS=8, plus psql and slack
EVERY_NOTEBOOK = 8  # the least AGENTLAB_MAX_CONNECTIONS under which every notebook ran (18 and 19 stall at 5)
ROOM_DOMAINS = ("billing", "retail")  # the templates the notebooks clone, built once by the setup

ENSURE_ROLE = """DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) THEN CREATE ROLE {role} {options}; END IF;
END $$"""


def attendee_names(attendees: int, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """``attendee1`` ... ``attendeeN`` (``prefix`` + a number)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", prefix):
        raise ValueError(f"the role prefix must be lower-case letters, digits and _, got {prefix!r}")
    if attendees < 1:
        raise ValueError(f"a room has at least 1 attendee, got {attendees}")
    return [f"{prefix}{i}" for i in range(1, attendees + 1)]


def ensure_role(role: str, options: str) -> sql.Composed:
    """A statement creating ``role`` with ``options`` (SQL text, e.g. ``"LOGIN"``) unless it exists."""
    return sql.SQL(ENSURE_ROLE).format(name=sql.Literal(role), role=sql.Identifier(role), options=sql.SQL(options))


def room_sql(attendees: int, *, prefix: str = DEFAULT_PREFIX, budget: int = DEFAULT_BUDGET) -> list[sql.Composed]:
    """The statements a superuser runs once for a room (idempotent: run again, they change only the limits)."""
    if budget < MIN_BUDGET + 2:
        raise ValueError(f"the budget is at least {MIN_BUDGET + 2} connections per attendee ({BUDGET_ENV}="
                         f"{MIN_BUDGET} for the kernel, 2 for psql and a first cell run again), got {budget}")
    out = [ensure_role(AGENT_ROLE, "LOGIN"),
           sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(AGENT_ROLE)),
           ensure_role(ROOM_ROLE, "NOLOGIN NOINHERIT"),
           sql.SQL("GRANT {} TO {}").format(sql.Identifier(AGENT_ROLE), sql.Identifier(ROOM_ROLE))]
    for name in attendee_names(attendees, prefix):
        ident = sql.Identifier(name)
        out += [ensure_role(name, "LOGIN CREATEDB"),
                sql.SQL("ALTER ROLE {} LOGIN CREATEDB CONNECTION LIMIT {}").format(ident, sql.Literal(budget)),
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(ROOM_ROLE), ident)]
    return out


def render(attendees: int, *, prefix: str = DEFAULT_PREFIX, budget: int = DEFAULT_BUDGET) -> str:
    """:func:`room_sql` as a script for psql, with what to do after it (no connection needed)."""
    lines = [f"{stmt.as_string(None)};" for stmt in room_sql(attendees, prefix=prefix, budget=budget)]
    return "\n".join([
        f"-- agentlab room: {attendees} attendee(s), {budget} connections each (run as a superuser)",
        *lines,
        "-- then, as the same superuser: python -m agentlab room setup --templates-only",
        f"-- (builds the templates; each attendee's kernel sets {BUDGET_ENV}={kernel_budget(budget)})",
    ])


def kernel_budget(budget: int) -> int:
    """The ``AGENTLAB_MAX_CONNECTIONS`` a kernel gets for a role limit of ``budget``: two connections are left
    for the attendee's psql and for a notebook's first cell run again while the old harness closes."""
    return max(MIN_BUDGET, budget - 2)


def setup(attendees: int, *, prefix: str = DEFAULT_PREFIX, budget: int = DEFAULT_BUDGET,
          templates_only: bool = False) -> list[str]:
    """Run :func:`room_sql` (unless ``templates_only``), build the templates of :data:`ROOM_DOMAINS` and hand
    every template's objects to ``pg_database_owner``; return one line per thing done.

    Raises:
        DatabaseUnavailable: no server, or the connecting role is not allowed (it names the right).
    """
    done = []
    if not templates_only:
        with db.admin_connection() as conn, _room_lock(conn):
            try:
                _run_role_statements(conn, room_sql(attendees, prefix=prefix, budget=budget))
            except psycopg.errors.InsufficientPrivilege as exc:
                raise db.DatabaseUnavailable(db.missing_right(exc, "setting up the room's roles")) from exc
        names = attendee_names(attendees, prefix)
        done.append(f"roles: {AGENT_ROLE}, {ROOM_ROLE}, {names[0]}..{names[-1]} (CONNECTION LIMIT {budget} each)")
    for domain in ROOM_DOMAINS:
        done.append(f"template {db.ensure_template(domain)}")
    moved = sum(db.hand_to_database_owner(db.with_dbname(db.server_url(), name))
                for name, is_template, _ in database_rows() if is_template)
    if moved:
        done.append(f"{moved} template object(s) handed to pg_database_owner")
    done.append(f"each attendee's kernel: DATABASE_URL naming the attendee, {BUDGET_ENV}={kernel_budget(budget)}")
    if kernel_budget(budget) < EVERY_NOTEBOOK:
        done.append(f"note: notebooks 18 and 19 need {BUDGET_ENV}={EVERY_NOTEBOOK} (--budget {EVERY_NOTEBOOK + 2}); "
                    "under this budget they stall (instructor/ROOM.md)")
    return done


ROOM_LOCK = 4251  # advisory lock key on the maintenance database: one room setup or teardown at a time


@contextlib.contextmanager
def _room_lock(conn):
    """Hold the session advisory lock :data:`ROOM_LOCK` on ``conn`` (the maintenance database): a teardown
    that drops :data:`ROOM_ROLE` never runs between another setup's check of that role and its GRANT."""
    conn.execute("SELECT pg_advisory_lock(%s)", (ROOM_LOCK,))
    try:
        yield
    finally:
        if not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s)", (ROOM_LOCK,))


ROLE_RACE_DEADLINE_S = 30.0  # how long setup keeps trying while another session holds a role's catalog row


def _run_role_statements(conn, statements: list[sql.Composed], *, deadline_s: float = ROLE_RACE_DEADLINE_S) -> None:
    """Run ``statements`` in one transaction, again from the start when another session changed the same
    role at the same moment. Roles are cluster-wide: a second room set up at once, or a kit database's
    migration letting the agent role log in, updates the same catalog row, and PostgreSQL refuses the later
    writer at once with "tuple concurrently updated" (SQLSTATE XX000) or a duplicate role or grant, rather
    than waiting. Run again once the other transaction ended, the idempotent statements find its work done.
    Waits 0.05 s doubling to 1 s between tries, each logged at INFO.

    Raises:
        psycopg.Error: the last race after ``deadline_s`` seconds, or any other error at once.
    """
    races = (psycopg.errors.InternalError_, psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation)
    give_up, pause_s, attempt = time.monotonic() + deadline_s, 0.05, 1
    while True:
        try:
            with conn.transaction():
                for stmt in statements:
                    conn.execute(stmt)
            return
        except races as exc:
            if isinstance(exc, psycopg.errors.InternalError_) and "concurrently" not in str(exc):
                raise
            if time.monotonic() + pause_s > give_up:
                raise
            log.info("room setup: another session changed the same role (%s); trying again (attempt %d)",
                     exc.sqlstate, attempt + 1)
            time.sleep(pause_s)
            pause_s, attempt = min(pause_s * 2, 1.0), attempt + 1


ROOM_ROLES = """
SELECT r.rolname FROM pg_roles r JOIN pg_auth_members m ON m.member = r.oid
WHERE m.roleid = (SELECT oid FROM pg_roles WHERE rolname = %s) AND r.rolname ~ %s ORDER BY r.rolname
"""


def teardown(*, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Drop the room: each attendee's databases (its templates go to the connecting role first), the attendee
    roles (members of :data:`ROOM_ROLE` named ``prefix`` + a number) and :data:`ROOM_ROLE`. The agent role
    stays (the templates grant it rights). Returns one line per thing done."""
    done = []
    with db.admin_connection() as conn, _room_lock(conn):
        roles = [r[0] for r in conn.execute(ROOM_ROLES, (ROOM_ROLE, f"^{re.escape(prefix)}[0-9]+$")).fetchall()]
        for role in roles:
            owned = conn.execute("SELECT datname, datistemplate FROM pg_database WHERE datdba = "
                                 "(SELECT oid FROM pg_roles WHERE rolname = %s)", (role,)).fetchall()
            for name, is_template in owned:
                if is_template and name.startswith(db.DB_PREFIX):
                    conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(sql.Identifier(name)))
                else:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                    done.append(f"dropped database {name}")
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
            done.append(f"dropped role {role}")
        if not conn.execute(ROOM_ROLES.replace("AND r.rolname ~ %s", ""), (ROOM_ROLE,)).fetchall():
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROOM_ROLE)))
            done.append(f"dropped role {ROOM_ROLE}")
    return done
