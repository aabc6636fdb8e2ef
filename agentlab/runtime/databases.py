"""The kit's own databases on the server: templates by fingerprint, a fresh copy per run, and their clean-up.

- Every demo, test, notebook and experiment works in its own database, created by name from a
  template that already holds the migrations and the checkpointer's tables, so a fresh database
  costs one ``CREATE DATABASE ... TEMPLATE`` (tens of milliseconds), not a migration run.
- A template is reused only when its comment holds the fingerprint of what built it; a stale one is
  dropped and rebuilt, with a warning in this module's log.
- On a shared server (a room, :mod:`agentlab.runtime.room`) the templates' objects belong to
  ``pg_database_owner`` (each copy's to whoever made it) and each database the kit creates is reachable by its
  owner, the superusers and the agent role only; a refusal is explained by :func:`missing_right`.

Which server these live on is :mod:`agentlab.runtime.server`'s concern.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import secrets
import time
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from agentlab.runtime.conninfo import CONNECT_TIMEOUT_S, DatabaseUnavailable, dbname_of, one_line, with_dbname
from agentlab.runtime.server import admin_connection, server_url

if TYPE_CHECKING:
    from agentlab.core.domain import Domain

log = logging.getLogger(__name__)

DB_PREFIX = "agentlab_"
TEMPLATE_LOCK_KEY = 0x6167_6C61  # pg_advisory_lock key serializing template builds ("agla")


# --------------------------------------------------------------------------- databases

def template_name(domain: Domain | str | None = None) -> str:
    """Name of ``domain``'s template database (default: billing), a copy of the core template (see
    :func:`core_template_name`) plus the domain's migrations and seed; the core template's own name for a
    domain with neither. Both names carry digests of what built them, so they change when it changes."""
    core = core_template_name()
    domain = _domain(domain)
    if not (domain.migrations or domain.seed is not None):
        return core
    return f"{core}_{domain.name[:16]}_{domain.fingerprint()[:8]}"


def core_template_name() -> str:
    """Name of the core template database: the core migrations and the checkpointer's tables."""
    from agentlab.core import schema

    return f"{DB_PREFIX}tpl_{schema.fingerprint()[:10]}"


def _domain(domain: Domain | str | None) -> Domain:
    from agentlab.runtime.domains import resolve_domain

    return resolve_domain(domain)


def template_fingerprint(domain: Domain | str | None = None, *, core: bool = False) -> str:
    """What a template must have been built from to be reused (stored as its comment when it is built):
    the core fingerprint (its migrations' checksums and the saver's version) and, unless ``core``, the
    domain's (its migrations' checksums and its seed; default domain billing)."""
    from agentlab.core import schema

    parts = [schema.fingerprint()]
    if not core:
        domain = _domain(domain)
        if domain.migrations or domain.seed is not None:
            parts.append(domain.fingerprint())
    return "agentlab template " + hashlib.sha256(":".join(parts).encode()).hexdigest()


def ensure_template(domain: Domain | str | None = None) -> str:
    """Build the core template (once per server and migration list; concurrent callers wait for one
    build) and ``domain``'s template on top of it (default: billing); return the domain's template name.

    Safe across processes: builds are serialized by an advisory lock and a half-built template is
    built under another name and renamed only when complete. It is marked ``IS_TEMPLATE``, so any
    role with ``CREATEDB`` on a shared server can copy it, whoever built it. A template is reused only
    when its comment holds :func:`template_fingerprint` (written once its recorded migrations were read
    back and matched the code's checksums); one that does not is stale: it is dropped and rebuilt, with
    a warning in the log, never silently reused.

    Raises:
        DatabaseUnavailable: no server, or the role may not create databases.
        agentlab.core.errors.DomainError: a domain migration fails or was edited (:func:`migrate_domain`).
    """
    from agentlab.core import schema

    domain = _domain(domain)
    core = _ensure(core_template_name(), None, schema.build_template, template_fingerprint(core=True),
                   [(schema.CORE, schema.MIGRATIONS)])
    name = template_name(domain)
    if name == core:
        return core
    return _ensure(name, core, lambda url: _build_domain_template(url, domain), template_fingerprint(domain),
                   [(schema.CORE, schema.MIGRATIONS), (domain.name, domain.migrations)])


def _build_domain_template(url: str, domain: Domain) -> None:
    from agentlab.core.domain import migrate_domain

    with psycopg.connect(url, autocommit=True) as conn:
        migrate_domain(conn, domain)
        if domain.seed is not None:
            with conn.transaction():
                domain.seed(conn)
        conn.execute("ANALYZE")


TEMPLATE_COMMENT = "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s"


def template_comment(conn: psycopg.Connection, name: str) -> str | None:
    """The comment of database ``name``; None when there is no such database, "" when it has none."""
    row = conn.execute(TEMPLATE_COMMENT, (name,)).fetchone()
    return None if row is None else (row[0] or "")


def _check_recorded(url: str, lists) -> None:
    """Read back what a just-built template recorded in ``schema_migrations``; raise RuntimeError unless
    each owner's checksums are exactly its list's."""
    from agentlab.core.migrations import applied_checksums

    with psycopg.connect(url, autocommit=True) as conn:
        for owner, migrations in lists:
            if applied_checksums(conn, owner) != [m.checksum for m in migrations]:
                raise RuntimeError(f"template build: the migrations recorded for {owner} differ from the code's")


def _ensure(name: str, source: str | None, build, fingerprint: str, lists) -> str:
    """Create template database ``name`` (empty, or a copy of template ``source``) with ``build(url)``,
    unless it exists with comment ``fingerprint``; a template of that name with another comment is
    stale and is dropped first."""
    with admin_connection() as conn:
        if template_comment(conn, name) == fingerprint:
            return name
        conn.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        building = f"{name}_building"
        try:
            found = template_comment(conn, name)
            if found == fingerprint:
                return name
            if found is not None:
                log.warning("template database %s is stale (built from other migrations or seed data than "
                            "this code's); rebuilding it", name)
                drop_database(name)
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building)))
            if source is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
            else:
                conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(building),
                                                                              sql.Identifier(source)))
            url = with_dbname(server_url(), building)
            build(url)
            _check_recorded(url, lists)
            hand_to_database_owner(url)
            conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(building),
                                                                        sql.Literal(fingerprint)))
            conn.execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(building), sql.Identifier(name))
            )
            conn.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE true").format(sql.Identifier(name)))
            log.info("built template database %s", name)
        except psycopg.errors.InsufficientPrivilege as exc:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building)))
            raise DatabaseUnavailable(missing_right(exc, f"building the template database {name}")) from exc
        except BaseException:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building)))
            raise
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK_KEY,))
    return name


def _exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def create_database(purpose: str = "scratch", domain: Domain | str | None = None) -> str:
    """Create a fresh database ``agentlab_<purpose>_<random>`` from the template (``domain``'s own when
    it has migrations or seed data); return its conninfo.

    Args:
        purpose: a short word for the name (letters, digits, underscore), e.g. ``"demo"``, ``"test"``.
        domain: an :class:`agentlab.core.domain.Domain` or a name (default: billing).

    Raises:
        DatabaseUnavailable: no server.
    """
    purpose = re.sub(r"[^a-z0-9_]", "_", purpose.lower())[:20] or "scratch"
    template = ensure_template(domain)
    name = f"{DB_PREFIX}{purpose}_{secrets.token_hex(4)}"
    with admin_connection() as conn:
        for attempt in range(20):
            try:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
                )
                break
            except psycopg.errors.InsufficientPrivilege as exc:
                raise DatabaseUnavailable(missing_right(exc, f"creating the database {name}")) from exc
            except psycopg.errors.ObjectInUse:
                # another session is still attached to the template (a build just finished); retry
                time.sleep(0.05 * (attempt + 1))
        else:  # pragma: no cover
            raise DatabaseUnavailable(f"template {template} stayed busy; retry, or run `python -m agentlab db reset`")
        keep_private(conn, name)
    return with_dbname(server_url(), name)


# --------------------------------------------------------------------------- a room: many roles, one server

# The objects a template's builder owns, as the statements that hand each to pg_database_owner (PostgreSQL 14+):
# in a copy of the template they then belong to whoever owns that copy, i.e. the role that made it (case C51).
# A sequence or index owned by a table follows its table; the public schema already belongs to pg_database_owner.
HAND_OVER = """
WITH me AS (SELECT oid FROM pg_roles WHERE rolname = current_user),
ns AS (SELECT oid, nspname, nspowner FROM pg_namespace
       WHERE nspname <> 'information_schema' AND nspname NOT LIKE 'pg\\_%')
SELECT format('ALTER SCHEMA %I OWNER TO pg_database_owner', nspname) FROM ns WHERE nspowner = (SELECT oid FROM me)
UNION ALL
SELECT format('ALTER TABLE %s OWNER TO pg_database_owner', c.oid::regclass)
FROM pg_class c JOIN ns ON ns.oid = c.relnamespace
WHERE c.relowner = (SELECT oid FROM me) AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                  AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))
UNION ALL
SELECT format('ALTER ROUTINE %s OWNER TO pg_database_owner', p.oid::regprocedure)
FROM pg_proc p JOIN ns ON ns.oid = p.pronamespace
WHERE p.proowner = (SELECT oid FROM me) AND p.prokind IN ('f', 'p')
UNION ALL
SELECT format('ALTER TYPE %s OWNER TO pg_database_owner', t.oid::regtype)
FROM pg_type t JOIN ns ON ns.oid = t.typnamespace
WHERE t.typowner = (SELECT oid FROM me) AND t.typtype IN ('e', 'd', 'r', 'm')
"""


def hand_to_database_owner(url: str) -> int:
    """Hand every object of the database at ``url`` that the connecting role owns to ``pg_database_owner``
    (:data:`HAND_OVER`), so that in each copy of it they belong to the copy's owner: a template built by the
    instructor (or by one attendee) then works for every attendee who clones it (case C51). Returns how many
    objects changed hands; 0 on a server older than PostgreSQL 14 (no ``pg_database_owner``)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        if conn.info.server_version < 140000:
            return 0
        statements = [row[0] for row in conn.execute(HAND_OVER).fetchall()]
        with conn.transaction():
            for statement in statements:
                conn.execute(statement)
    return len(statements)


def keep_private(conn: psycopg.Connection, name: str) -> None:
    """Make database ``name`` (just created by the connecting role, its owner) reachable by its owner, the
    superusers and the agent role only: ``REVOKE ALL ... FROM PUBLIC`` (a new database lets every role
    connect) and ``GRANT CONNECT`` to :data:`agentlab.core.agent_role.AGENT_ROLE`, which the tools pool logs in as
    (case C52: on a shared server one attendee cannot open another's database)."""
    from agentlab.core.agent_role import AGENT_ROLE

    ident = sql.Identifier(name)
    with conn.transaction():  # one change: nobody ever sees the database closed to PUBLIC and not yet to the agent
        conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(ident))
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (AGENT_ROLE,)).fetchone():
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(ident, sql.Identifier(AGENT_ROLE)))


# What a refusal (SQLSTATE 42501) means for the kit: the right that is missing and the statement that needs it,
# matched on the server's message, most specific first.
MISSING_RIGHTS = (
    (r"permission denied to create role", "CREATEROLE",
     "CREATE ROLE agentlab_agent (the agent role, made once per server)"),
    (r"permission denied to create database", "CREATEDB", "CREATE DATABASE (one per notebook, demo and run)"),
    (r"cannot SET ROLE|must be (a )?member of role", "membership in agentlab_agent",
     "SET ROLE agentlab_agent (the tools run as the agent role)"),
    (r"permission denied for (table|schema|sequence|function|relation) (\S+)",
     "ownership of the template's objects", "the checkpointer's and migrations' reads of {2}"),
    (r"must be owner of", "ownership", "ALTER on an object another role built"),
)


def missing_right(exc: psycopg.Error, doing: str) -> str:
    """One line for a refusal: who was refused, the right that is missing, the statement that needs it, and
    the room setup that grants it (:mod:`agentlab.runtime.room`)."""
    text = one_line(exc)
    role = ""
    with contextlib.suppress(Exception):
        role = conninfo_to_dict(server_url()).get("user") or ""
    who = f"the role {role}" if role else "the database role"
    for pattern, right, statement in MISSING_RIGHTS:
        m = re.search(pattern, str(exc))
        if m:
            statement = statement.format(*([m.group(0)] + list(m.groups())))
            return (f"{who} lacks {right}, which {statement} needs, while {doing} ({text}); on a shared server "
                    "a superuser runs `python -m agentlab room setup --attendees N` once (or the SQL of "
                    "`python -m agentlab room sql`), see instructor/ROOM.md")
    hint = (exc.diag.message_hint or "").strip() if isinstance(exc, psycopg.Error) else ""
    return f"{who} was refused while {doing} ({text}{'; ' + hint if hint else ''}); see instructor/ROOM.md"


def drop_database(url_or_name: str) -> None:
    """Drop a database made by :func:`create_database` or a template (by name or conninfo), closing
    its sessions. Raises ValueError for a name the kit did not make."""
    name = url_or_name if "=" not in url_or_name and "://" not in url_or_name else dbname_of(url_or_name)
    if not name.startswith(DB_PREFIX):
        raise ValueError(f"refusing to drop {name!r}: not an agentlab database")
    with admin_connection() as conn:
        if _exists(conn, name):
            conn.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(name)))
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        try:
            conn.execute(drop)
        except psycopg.errors.InsufficientPrivilege:
            # an attendee's role may not terminate the agent role's sessions (C51); the kit has closed them, and a
            # closed session's backend exits a moment later: wait for it (at most DROP_WAIT_S), then drop again
            deadline = time.monotonic() + DROP_WAIT_S
            while time.monotonic() < deadline and conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND usename <> current_user",
                    (name,)).fetchone()[0]:
                time.sleep(0.05)
            conn.execute(drop)


DROP_WAIT_S = 5.0
"""How long :func:`drop_database` waits for the closed sessions of a role it may not terminate to exit (seconds)."""


LIST_DATABASES = """
SELECT d.datname, d.datistemplate, (SELECT count(*) FROM pg_stat_activity a WHERE a.datname = d.datname)
FROM pg_database d WHERE d.datname LIKE 'agentlab\\_%%' ORDER BY d.datname
"""


def list_databases() -> list[str]:
    """Names of every agentlab database on the server (templates included): ``agentlab_...`` only."""
    return [name for name, _, _ in database_rows()]


def database_rows() -> list[tuple[str, bool, int]]:
    """Every agentlab database on the server as ``(name, is_template, sessions connected)``, by name."""
    with admin_connection() as conn:
        return [tuple(r) for r in conn.execute(LIST_DATABASES).fetchall()]


def clean() -> list[str]:
    """Drop the leftovers of interrupted runs: agentlab databases that are not templates and that no
    session is connected to. Returns their names. Databases in use by a running notebook, test or
    experiment are left alone."""
    dropped = []
    for name, is_template, sessions in database_rows():
        if not is_template and sessions == 0:
            drop_database(name)
            dropped.append(name)
    return dropped


def reset() -> int:
    """Drop every agentlab database (templates included) on the server in use; return how many."""
    names = list_databases()
    for name in names:
        drop_database(name)
    return len(names)
