"""The database, as one import: the names of :mod:`agentlab.runtime.conninfo`, :mod:`agentlab.runtime.server`
and :mod:`agentlab.runtime.databases`, kept here so that ``from agentlab.runtime import db`` and
``db.create_database(...)`` work as before the split (issue 26).

Where things went:

- :mod:`agentlab.runtime.conninfo`: connection strings and the errors of reaching a server
  (``DatabaseUnavailable``, ``DatabaseMissing``, ``ConnectionLimitReached``, ``role_limit_message``,
  ``check_role_limit``, ``with_dbname``, ``safe_dsn``, ``agent_conninfo``, ``dbname_of``, ``ENV_VAR``,
  ``AGENT_PASSWORD_ENV``, ``CONNECT_TIMEOUT_S``; once private here: ``connect_reason``, ``one_line``,
  ``server_address``).
- :mod:`agentlab.runtime.server`: which server, and the embedded one's life (``server``, ``server_url``,
  ``ServerInfo``, ``admin_connection``, ``is_embedded``, ``data_dir``, ``start_embedded``, ``stop_embedded``,
  ``restart_embedded``, ``reset_embedded``; the process's cached server is ``server._server``).
- :mod:`agentlab.runtime.databases`: the kit's databases on it (templates, ``create_database``,
  ``drop_database``, ``list_databases``, ``clean``, ``reset``, the room's ``hand_to_database_owner``,
  ``keep_private`` and ``missing_right``; once private here: ``template_comment``, ``database_rows``).

A name the kit calls through this module (``db.drop_database`` from :class:`agentlab.runtime.harness.Harness`)
can be patched here; code inside the three modules calls its neighbours directly, so patch those in their home.
"""

from agentlab.runtime.conninfo import (
    AGENT_PASSWORD_ENV,
    CONNECT_TIMEOUT_S,
    ENV_VAR,
    ROLE_LIMIT,
    ConnectionLimitReached,
    DatabaseMissing,
    DatabaseUnavailable,
    agent_conninfo,
    check_role_limit,
    dbname_of,
    role_limit_message,
    safe_dsn,
    with_dbname,
)
from agentlab.runtime.databases import (
    DB_PREFIX,
    HAND_OVER,
    LIST_DATABASES,
    MISSING_RIGHTS,
    TEMPLATE_COMMENT,
    TEMPLATE_LOCK_KEY,
    clean,
    core_template_name,
    create_database,
    drop_database,
    ensure_template,
    hand_to_database_owner,
    keep_private,
    list_databases,
    missing_right,
    reset,
    template_fingerprint,
    template_name,
)
from agentlab.runtime.server import (
    EMBEDDED_SETTINGS,
    RESTART_MODES,
    RESTART_TIMEOUT_S,
    START_LOCK,
    START_WAIT_S,
    ServerInfo,
    admin_connection,
    data_dir,
    is_embedded,
    reset_embedded,
    restart_embedded,
    server,
    server_url,
    start_embedded,
    stop_embedded,
)

__all__ = [
    # conninfo
    "AGENT_PASSWORD_ENV", "CONNECT_TIMEOUT_S", "ENV_VAR", "ROLE_LIMIT", "ConnectionLimitReached", "DatabaseMissing",
    "DatabaseUnavailable", "agent_conninfo", "check_role_limit", "dbname_of", "role_limit_message", "safe_dsn",
    "with_dbname",
    # server
    "EMBEDDED_SETTINGS", "RESTART_MODES", "RESTART_TIMEOUT_S", "START_LOCK", "START_WAIT_S", "ServerInfo",
    "admin_connection", "data_dir", "is_embedded", "reset_embedded", "restart_embedded", "server", "server_url",
    "start_embedded", "stop_embedded",
    # databases
    "DB_PREFIX", "HAND_OVER", "LIST_DATABASES", "MISSING_RIGHTS", "TEMPLATE_COMMENT", "TEMPLATE_LOCK_KEY", "clean",
    "core_template_name", "create_database", "drop_database", "ensure_template", "hand_to_database_owner",
    "keep_private", "list_databases", "missing_right", "reset", "template_fingerprint", "template_name",
]
