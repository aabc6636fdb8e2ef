"""The handler contract, enforced: a tool's handler works inside its call's savepoint and nowhere else.

A handler gets the batch's connection. It may run any statement on it, nest its own blocks with
``conn.transaction()`` and read results as it likes; it must not end or escape the batch's transaction or
leave session state behind on a pooled connection (DESIGN.md "A domain is a contract"). The node hands
each handler a :class:`GuardedConnection` that refuses, before anything reaches the server, by name:

- ending the batch's transaction: ``COMMIT``, ``END``, ``ROLLBACK``, ``ABORT``, ``PREPARE TRANSACTION``,
  ``conn.commit()``, ``conn.rollback()`` (case C43);
- escaping its savepoint: ``SAVEPOINT`` / ``RELEASE`` / ``ROLLBACK TO`` written by hand, ``BEGIN``,
  ``START TRANSACTION`` (``conn.transaction()`` nests correctly: use it);
- leaving session state behind: ``SET`` without ``LOCAL``, ``RESET``, ``DISCARD``, ``conn.autocommit``,
  ``conn.set_*`` (case C44: ``SET LOCAL`` ends with the batch, ``SET`` stays on the pooled connection);
- changing the role the batch runs as: ``SET [LOCAL] ROLE``, ``RESET ROLE``, ``SET SESSION AUTHORIZATION``,
  ``set_config('role', ...)``, the kit's own settings (``agentlab.tenant_id``, which row-level security reads)
  (case C45: isolation is the agent role and the thread's tenant);
- reaching past the connection: ``conn.pgconn`` (libpq itself).

The refusal is a :class:`HandlerContractViolation` naming the tool and the rule (in the log and the events;
the model is told the tool failed, not how): the call is FAILED, the batch goes on per its policy (the
statement never ran). The strategies also check, where psycopg can tell
(outside a pipeline), that the transaction is still open after the handler returned.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg import sql

from agentlab.core.errors import Category, ToolError

ENDS_TRANSACTION = "ends the batch's transaction"
ESCAPES_SAVEPOINT = "escapes its call's savepoint (use conn.transaction() to nest)"
LEAVES_SESSION_STATE = "leaves session state on a pooled connection (use SET LOCAL)"
REACHES_PAST = "reaches past the connection to libpq"
ESCAPES_ROLE = "changes the role or the tenant the batch runs as"
CONTRACT_HINT = ("the tool {tool} failed inside the kit (a fault in the tool, not in your arguments); nothing of "
                 "this call was applied: do not send it again.")

# the first words of a statement -> the rule it breaks (checked in order; None: allowed)
_RULES: tuple[tuple[re.Pattern, str | None], ...] = (
    (re.compile(r"(set|reset)\s+(local\s+|session\s+)?(role|session\s+authorization)\b"), ESCAPES_ROLE),
    (re.compile(r"select\b.*\bset_config\s*\(\s*'(role|session_authorization|agentlab\.[\w.]*)'", re.S),
     ESCAPES_ROLE),
    (re.compile(r"set\s+(local\s+|session\s+)?agentlab\."), ESCAPES_ROLE),  # the tenant row-level security reads
    (re.compile(r"(rollback|abort)\s+(work\s+|transaction\s+)?to\b"), ESCAPES_SAVEPOINT),
    (re.compile(r"(commit|end|rollback|abort)\b(?!\s+prepared)"), ENDS_TRANSACTION),
    (re.compile(r"(commit|rollback)\s+prepared\b"), ENDS_TRANSACTION),
    (re.compile(r"prepare\s+transaction\b"), ENDS_TRANSACTION),
    (re.compile(r"(begin|start\s+transaction|savepoint|release)\b"), ESCAPES_SAVEPOINT),
    (re.compile(r"set\s+(local|constraints|transaction)\b"), None),
    (re.compile(r"(set|reset|discard)\b"), LEAVES_SESSION_STATE),
)
_TOKEN = re.compile(r"""--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|"(?:[^"]|"")*"|(\$\w*\$).*?\1|;""", re.S)


class HandlerContractViolation(ToolError):
    """Raised when a tool's handler tries to end or escape the batch's transaction or leave session state."""

    category = Category.INTERNAL

    def __init__(self, tool: str, rule: str, statement: str = ""):
        super().__init__(CONTRACT_HINT.format(tool=tool))  # the model-facing hint; str() is for the log
        self.tool, self.rule, self.statement = tool, rule, statement
        self.args = (f"the handler of tool {tool} {rule}" + (f": {statement}" if statement else ""),)


def statements(query: str) -> list[str]:
    """The statements of ``query`` (split at semicolons outside quotes, dollar quotes and comments), each
    lower-cased with its comments and leading whitespace removed."""
    parts, start, text = [], 0, query
    cleaned: list[str] = []
    for m in _TOKEN.finditer(text):
        if m.group(0) == ";":
            parts.append("".join(cleaned) + text[start:m.start()])
            cleaned, start = [], m.end()
        elif m.group(0).startswith(("--", "/*")):
            cleaned.append(text[start:m.start()] + " ")
            start = m.end()
    parts.append("".join(cleaned) + text[start:])
    return [p.strip().lower() for p in parts if p.strip()]


def broken_rule(query: str) -> str | None:
    """The rule the first offending statement of ``query`` breaks, None when every statement is allowed."""
    for statement in statements(query):
        statement = statement.lstrip("(")
        for pattern, rule in _RULES:
            if pattern.match(statement):
                if rule is not None:
                    return rule
                break
    return None


class _Guarded:
    """Shared by the guarded connection and cursor: checks each query before it is sent."""

    def __init__(self, target: Any, tool: str, conn: Any) -> None:
        self._target, self._tool, self._conn = target, tool, conn

    def _check(self, query: Any) -> None:
        if isinstance(query, sql.Composable):
            query = query.as_string(self._conn)
        elif isinstance(query, bytes | bytearray | memoryview):
            query = bytes(query).decode("utf-8", "replace")
        rule = broken_rule(str(query))
        if rule is not None:
            raise HandlerContractViolation(self._tool, rule, str(query)[:200])

    def __getattr__(self, name: str) -> Any:
        if name == "pgconn":
            raise HandlerContractViolation(self._tool, REACHES_PAST)
        if name == "connection":  # a cursor's connection: the guarded one
            return GuardedConnection(self._conn, self._tool)
        return getattr(self._target, name)


class GuardedCursor(_Guarded):
    """A psycopg async cursor whose ``execute`` / ``executemany`` / ``stream`` / ``copy`` are checked."""

    async def execute(self, query, params=None, **kwargs):
        self._check(query)
        await self._target.execute(query, params, **kwargs)
        return self

    async def executemany(self, query, params_seq, **kwargs):
        self._check(query)
        return await self._target.executemany(query, params_seq, **kwargs)

    def stream(self, query, params=None, **kwargs):
        self._check(query)
        return self._target.stream(query, params, **kwargs)

    def copy(self, statement, params=None, **kwargs):
        self._check(statement)
        return self._target.copy(statement, params, **kwargs)

    async def __aenter__(self):
        await self._target.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._target.__aexit__(*exc)

    def __aiter__(self):
        return self._target.__aiter__()


class GuardedConnection(_Guarded):
    """The batch's ``psycopg.AsyncConnection`` as a handler sees it: every method works as psycopg's, but
    what would end or escape the batch's transaction or leave session state is refused
    (:class:`HandlerContractViolation`)."""

    def __init__(self, conn: Any, tool: str) -> None:
        super().__init__(conn, tool, conn)

    async def execute(self, query, params=None, **kwargs):
        self._check(query)
        return GuardedCursor(await self._target.execute(query, params, **kwargs), self._tool, self._target)

    def cursor(self, *args, **kwargs):
        return GuardedCursor(self._target.cursor(*args, **kwargs), self._tool, self._target)

    async def commit(self):
        raise HandlerContractViolation(self._tool, ENDS_TRANSACTION, "commit()")

    async def rollback(self):
        raise HandlerContractViolation(self._tool, ENDS_TRANSACTION, "rollback()")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            raise HandlerContractViolation(self._tool, LEAVES_SESSION_STATE, f"conn.{name} = ...")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("set_"):  # set_autocommit, set_isolation_level, set_read_only, set_deferrable
            raise HandlerContractViolation(self._tool, LEAVES_SESSION_STATE, f"conn.{name}()")
        return super().__getattr__(name)
