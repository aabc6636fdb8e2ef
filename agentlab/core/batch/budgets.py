"""Tool-call budgets kept in the database: per thread and per run, per tool and in total.

A :class:`CallBudgets` value, given to the tools node, caps how many calls may be applied: in a thread
(for ever), in a run (``configurable["run_id"]``; a run without one counts under its thread), of each tool
and of all tools. The counters are rows of ``runs.call_budgets`` (a migration), spent inside the batch's
transaction, in the call's own savepoint, before the tool runs::

    SAVEPOINT tool_call
    SELECT scope, tool FROM runs.spend_calls(...)   one upsert: used = used + 1 WHERE used < limit
    the tool's statements, its ledger row; RELEASE tool_call

A counter without room is left unchanged and the call is answered ``FAILED [budget]`` naming the limit it
hit (:class:`BudgetSpent`); its siblings go on per the batch's policy (atomic: the batch rolls back; partial:
the others go on). A call undone (its own failure, an atomic rollback) gives its calls back with its
savepoint; a call the ledger answers (a retry, a resume) is not spent again. Because the count is a row
updated under its lock in the batch's transaction, it holds across crashes and resumes (it committed with
the calls it counts, or not at all) and across two runs at once (the second waits for the first's row lock,
then sees its count). A budget kept in graph state has neither property (:mod:`agentlab.lab.budgets`).

Cost: one statement per budgeted call, and on the pipelined path one more round trip per call (its answer is
read before the tool runs): three calls take 17 round trips on the reference path instead of 14, 8 pipelined
instead of 5. Without budgets nothing is sent. The ladder's first drafts (:mod:`agentlab.core.batch.drafts`,
autocommit) spend no budget.

Sources: LangChain's ``ToolCallLimitMiddleware`` (thread and run limits, per tool or all); PostgreSQL docs
"INSERT ... ON CONFLICT DO UPDATE" (the WHERE is checked against the row's latest version, under its lock).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agentlab.core.errors import Category, DomainError, ToolError

THREAD, RUN = "thread", "run"
ALL_TOOLS = "*"  # the counter of every tool's calls
SPEND_CALLS = "SELECT scope, tool FROM runs.spend_calls(%s, %s, %s, %s)"
BUDGET_SPENT = ("this {scope}'s limit of {limit} {what} is reached; this call was not applied. Do not send "
                "{again} again in this {scope}.")


@dataclass(frozen=True)
class Limit:
    """One counter a call spends on: ``scope`` (``"thread"`` or ``"run"``), ``tool`` (:data:`ALL_TOOLS` for
    the total) and ``limit`` (calls)."""

    scope: str
    tool: str
    limit: int

    def message(self) -> str:
        """The model-facing reason of a call over this limit."""
        total = self.tool == ALL_TOOLS
        what = f"tool call{'s' if self.limit != 1 else ''}" + ("" if total else f" of {self.tool}")
        return BUDGET_SPENT.format(scope=self.scope, limit=self.limit, what=what,
                                   again="tool calls" if total else f"{self.tool} calls")


class BudgetSpent(ToolError):
    """Raised (inside the call's savepoint) when a call would go over one of its :class:`Limit`\\ s."""

    category = Category.BUDGET

    def __init__(self, limit: Limit):
        super().__init__(limit.message())
        self.limit = limit


def _check(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise DomainError(f"{name} must be a whole number of calls above zero, got {value!r}; "
                          "leave it None for no limit")


@dataclass(frozen=True)
class CallBudgets:
    """How many tool calls may be applied, counted in the database.

    Args:
        per_thread: calls of any tool in one thread, over all its runs; None: no limit.
        per_run: calls of any tool in one run (``configurable["run_id"]``); None: no limit.
        per_thread_by_tool: ``{tool name: calls}`` in one thread.
        per_run_by_tool: ``{tool name: calls}`` in one run.

    Raises:
        DomainError: a limit is not a whole number above zero (a budget of zero would refuse every call:
            leave the tool out of the toolset instead), or a tool name is not text.
    """

    per_thread: int | None = None
    per_run: int | None = None
    per_thread_by_tool: Mapping[str, int] = field(default_factory=dict)
    per_run_by_tool: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check("per_thread", self.per_thread)
        _check("per_run", self.per_run)
        for label, table in (("per_thread_by_tool", self.per_thread_by_tool), ("per_run_by_tool", self.per_run_by_tool)):
            for tool, n in table.items():
                if not isinstance(tool, str) or not tool or tool == ALL_TOOLS:
                    raise DomainError(f"{label}: {tool!r} is not a tool name")
                _check(f"{label}[{tool!r}]", n)
                if n is None:
                    raise DomainError(f"{label}[{tool!r}] must be a whole number of calls above zero, got None")

    def check_tools(self, names: Iterable[str]) -> None:
        """Raise DomainError when a per-tool limit names a tool not in ``names`` (the node's toolset)."""
        known = set(names)
        for table in (self.per_thread_by_tool, self.per_run_by_tool):
            for tool in table:
                if tool not in known:
                    raise DomainError(f"a call budget names {tool!r}, which is not a tool; use one of: "
                                      f"{', '.join(sorted(known))}")

    def limits(self, tool: str) -> list[Limit]:
        """The counters a call of ``tool`` spends on, thread ones first; [] when none applies."""
        out = []
        for scope, total, by_tool in ((THREAD, self.per_thread, self.per_thread_by_tool),
                                      (RUN, self.per_run, self.per_run_by_tool)):
            if total is not None:
                out.append(Limit(scope, ALL_TOOLS, total))
            if tool in by_tool:
                out.append(Limit(scope, tool, by_tool[tool]))
        return out


@dataclass(frozen=True)
class Spend:
    """What one call spends: its :class:`Limit`\\ s, and the thread and run ids they are counted under."""

    limits: tuple[Limit, ...]
    thread_id: str
    run_id: str | None

    def params(self) -> tuple[list[str], list[str], list[str], list[int]]:
        ids = {THREAD: self.thread_id, RUN: self.run_id if self.run_id is not None else f"thread:{self.thread_id}"}
        return ([lim.scope for lim in self.limits], [ids[lim.scope] for lim in self.limits],
                [lim.tool for lim in self.limits], [lim.limit for lim in self.limits])


async def spend_calls(conn, s: Spend) -> None:
    """Spend one call on each counter of ``s`` (one statement, inside the call's savepoint).

    Raises:
        BudgetSpent: a counter had no room; the first such limit, thread ones first. The caller's savepoint
            rollback gives back what the other counters took.
    """
    cur = await conn.execute(SPEND_CALLS, s.params())
    passed = {(scope, tool) for scope, tool in await cur.fetchall()}
    for lim in s.limits:
        if (lim.scope, lim.tool) not in passed:
            raise BudgetSpent(lim)
