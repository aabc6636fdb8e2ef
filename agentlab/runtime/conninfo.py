"""Connection strings as the kit reads and prints them, and the errors of reaching a server.

- :class:`DatabaseUnavailable` (and its two kinds, :class:`DatabaseMissing` and :class:`ConnectionLimitReached`)
  carries one line that says what failed and how to fix it; the CLI prints it and exits with code 2.
- :func:`safe_dsn`, :func:`connect_reason` and :func:`one_line` are the ways a connection string or a
  server's error reaches a message: a password never does.
- :func:`with_dbname`, :func:`dbname_of`, :func:`server_address` and :func:`agent_conninfo` read and rewrite a
  conninfo string or URL without connecting (:func:`check_role_limit` alone connects, once).

Where the server is, and the embedded one's life, are :mod:`agentlab.runtime.server`'s; the databases the kit
makes on it are :mod:`agentlab.runtime.databases`'.
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from agentlab.core.errors import AgentlabError
from agentlab.core.redact import redact

ENV_VAR = "DATABASE_URL"
AGENT_PASSWORD_ENV = "AGENTLAB_AGENT_PASSWORD"  # the agent role's own password, when the server asks for one
CONNECT_TIMEOUT_S = 5


class DatabaseUnavailable(AgentlabError):
    """Raised when the database a run needs cannot be reached: no server could be reached or started, or
    (:class:`DatabaseMissing`) the server answers but the run's database is gone. The message is one
    actionable line."""


class DatabaseMissing(DatabaseUnavailable):
    """The server is running, but the run's database no longer exists (SQLSTATE 3D000): something dropped
    it, e.g. ``await h.close()`` (a notebook's last cell) or ``python -m agentlab db clean``. The message
    names the database and never blames the server."""


class ConnectionLimitReached(DatabaseUnavailable):
    """Raised when the server refuses a connection because the connecting role has reached its ``CONNECTION
    LIMIT`` (SQLSTATE 53300, "too many connections for role"): the server is fine; the message names the role
    and the setting that keeps a notebook within the limit (case C53)."""


ROLE_LIMIT = re.compile(r'too many connections for role "?([^"\s]+)"?')


def role_limit_message(exc: BaseException | None) -> str | None:
    """One line for a refusal by the role's connection limit, or None when ``exc`` is not one."""
    from agentlab.core.budget import ENV_VAR as BUDGET_ENV

    m = ROLE_LIMIT.search(str(exc or ""))
    if m is None:
        return None
    role, now = m.group(1), os.environ.get(BUDGET_ENV, "").strip() or "unset"
    return (f'the role {role} has reached its connection limit (SQLSTATE 53300 "too many connections for role"; '
            f"the server itself is fine): set {BUDGET_ENV} (now {now}) below that limit, e.g. two less, and re-run "
            f"the notebook, or raise the limit (ALTER ROLE {role} CONNECTION LIMIT n); see instructor/ROOM.md")


def check_role_limit(url: str) -> None:
    """Connect to ``url`` once, to tell a role's connection limit from other reasons a pool could not fill.

    Raises:
        ConnectionLimitReached: the server refused the connection for the role's ``CONNECTION LIMIT``.
    """
    try:
        psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S).close()
    except psycopg.OperationalError as exc:
        if (limit := role_limit_message(exc)) is not None:
            raise ConnectionLimitReached(limit) from exc


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


def agent_conninfo(url: str) -> str:
    """``url``'s server and database, logged in as the agent role (:data:`agentlab.core.agent_role.AGENT_ROLE`)
    with its own credentials: the password in ``AGENTLAB_AGENT_PASSWORD`` when set, else none (a trust
    or peer rule, or the agent's line in a ``.pgpass`` file); never ``url``'s own password.

    Under an isolating preset the tools pool connects with it (case C45): a tool's SQL then runs in a session
    that *is* the least-privilege role, so ``RESET ROLE`` or ``SET ROLE <owner>`` has nothing to go back to."""
    from agentlab.core.agent_role import AGENT_ROLE

    params = conninfo_to_dict(url)
    params.pop("password", None)
    password = os.environ.get(AGENT_PASSWORD_ENV)
    if password:
        params["password"] = password
    params["user"] = AGENT_ROLE
    return make_conninfo(**params)


def dbname_of(url: str) -> str:
    """The database name a URL or conninfo string points at."""
    return conninfo_to_dict(url).get("dbname") or "postgres"


def server_address(url: str) -> tuple[str, str]:
    """The (host, port) a conninfo or URL connects to, as libpq reads them (defaults filled in)."""
    params = conninfo_to_dict(url)
    return params.get("host") or "", str(params.get("port") or "5432")


# --------------------------------------------------------------------------- errors as one line

def one_line(exc: BaseException | None) -> str:
    """The last non-empty line of ``exc``'s message, redacted and cut to 200 characters ("" for none)."""
    lines = [ln.strip() for ln in str(exc or "").strip().splitlines() if ln.strip()]
    return redact(lines[-1])[:200] if lines else ""


def connect_reason(exc: BaseException) -> str:
    """The informative part of a connection error: 'Connection refused', 'password authentication failed'..."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in lines:
        m = re.search(r".*failed: (.+)$", ln)
        if m and not m.group(1).startswith("Is the server"):
            return redact(m.group(1))[:200]
    return redact(lines[0])[:200] if lines else type(exc).__name__
