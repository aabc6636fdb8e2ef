"""A real PgBouncer in transaction pool mode, started by a test in front of the test's PostgreSQL.

:func:`pgbouncer` writes an ini file and a user list into a temporary folder, starts ``pgbouncer`` on a
free port of 127.0.0.1 in front of the server that ``url`` names (the embedded server's unix socket,
or ``DATABASE_URL``'s host), waits until it accepts connections and yields the same conninfo with the
pooler's host and port. The test is skipped, with one line saying how to install it, when the
``pgbouncer`` binary is missing.

Run as root, PgBouncer refuses to start unless told which user to become (``-u``): the owner of the
server's socket folder (so it can reach the socket), else ``postgres``, else ``nobody``.

Sources: PgBouncer docs "Configuration" (``pool_mode``, ``auth_type = trust`` still needs the user in
``auth_file``), "Usage" (``-u``); libpq "Connection Strings".
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentlab.core.schema import AGENT_ROLE
from agentlab.runtime import db

INSTALL_HINT = "pgbouncer is not installed: `apt-get install -y pgbouncer` (Debian's package) to run this test"
START_WAIT_S = 10.0

# query_wait_timeout: PgBouncer's default (120 s). A client queued behind the pool_size server connections
# waits for one; at 15 s a loaded machine (CI running notebooks beside the suite) timed a drain out.
INI = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {userlist}
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
max_client_conn = 400
max_db_connections = {pool_size}
server_lifetime = 3600
query_wait_timeout = 120
log_connections = 0
log_disconnections = 0
"""


def pgbouncer_binary() -> str | None:
    """The ``pgbouncer`` executable (Debian puts it in /usr/sbin, outside a user's PATH), or None."""
    return shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
                                              if os.access(p, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as(host: str) -> str | None:
    """The user PgBouncer runs as (``-u``) when we are root; None otherwise."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name).pw_name
    return None


@contextlib.contextmanager
def pgbouncer(url: str, *, pool_size: int = 2):
    """Start PgBouncer (``pool_mode = transaction``, at most ``pool_size`` server connections per database
    and user) in front of the server of ``url``; yield ``url`` re-pointed at the pooler. Stopped on exit.

    Skips the test when the binary is missing; raises RuntimeError (with PgBouncer's own log) when it
    does not come up within 10 s.
    """
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip(INSTALL_HINT)
    params = conninfo_to_dict(url)
    host, port = params.get("host") or "/tmp", params.get("port") or "5432"
    user, password = params.get("user") or "postgres", params.get("password") or ""
    run_as = _run_as(host)
    folder = Path(tempfile.mkdtemp(prefix="agentlab-pgbouncer-"))
    try:
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            listen_port = _free_port()
            # the agent role logs in on its own under isolation (case C45): the pooler must know it too
            agent_password = os.environ.get(db.AGENT_PASSWORD_ENV, "")
            (folder / "userlist.txt").write_text(f'"{user}" "{password}"\n"{AGENT_ROLE}" "{agent_password}"\n')
            (folder / "pgbouncer.ini").write_text(INI.format(host=host, port=port, listen_port=listen_port,
                                                             userlist=folder / "userlist.txt", pool_size=pool_size))
            if run_as is not None:  # the user PgBouncer becomes reads its files
                entry = pwd.getpwnam(run_as)
                for path in (folder, *folder.iterdir()):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
            log = open(folder / "pgbouncer.log", "wb")  # noqa: SIM115 (kept open while PgBouncer runs)
            cmd = [binary, *(["-u", run_as] if run_as else []), str(folder / "pgbouncer.ini")]
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            pooled = make_conninfo(url, host="127.0.0.1", port=str(listen_port))
            if _wait_ready(proc, pooled):
                break
            _stop(proc)
            log.close()
        else:
            raise RuntimeError(f"pgbouncer did not start: {(folder / 'pgbouncer.log').read_text()[-2000:]}")
        try:
            yield pooled
        finally:
            _stop(proc)
            log.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_ready(proc: subprocess.Popen, url: str) -> bool:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            time.sleep(0.05)
    return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
