"""How a batch's calls run: the :class:`BatchStrategy` protocol and the :class:`Batch` it is given.

The node (:mod:`agentlab.core.batch.node`) prepares the calls, hands those that may run to a strategy and
answers every call id from the :class:`~agentlab.core.batch.results.Settled` value the strategy returns.
The strategies:

- :class:`agentlab.core.batch.savepoints.SavepointStrategy`: one transaction, a savepoint per call
  (psycopg's nested ``conn.transaction()``): the reference path, the one to take home;
- :class:`agentlab.core.batch.pipelined.PipelinedStrategy`: the same statements in one pipeline (fewer
  round trips), held equal to the reference by a differential test;
- :mod:`agentlab.core.batch.drafts`: first drafts that are deliberately wrong, for the ladder.

:func:`agentlab.core.batch.choice.strategy_for` is the one place that maps safeguards to a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agentlab.core.batch.budgets import CallBudgets, Spend
from agentlab.core.batch.calls import Call
from agentlab.core.batch.ledger import key_of
from agentlab.core.batch.results import Settled
from agentlab.core.errors import ErrorHints, Translation, translate
from agentlab.core.events import EventLog
from agentlab.core.hooks import Hook
from agentlab.core.safeguards import Safeguards
from agentlab.core.toolspec import ToolContext


@dataclass
class NodeHooks:
    """Fault-injection points (used by :mod:`agentlab.lab.faults` and the tests).

    ``before_call(call, index)`` and ``after_call(call, index)`` run around each tool call inside the
    transaction; ``after_commit(calls)`` runs after COMMIT returned and before the node returns. With a
    ``before_call`` or ``after_call`` hook the pipelined strategy does not fold a call's ledger row and
    RELEASE into the next call's round trip: each call ends with its own Sync, so a hook sees every
    statement sent so far answered.
    """

    before_call: list[Hook] = field(default_factory=list)
    after_call: list[Hook] = field(default_factory=list)
    after_commit: list[Hook] = field(default_factory=list)


@dataclass(frozen=True)
class Batch:
    """One batch as a strategy sees it: where it runs, under which switches, for which thread and tenant.

    ``pool`` is a ``psycopg_pool.AsyncConnectionPool`` of autocommit connections; ``attempt`` the node's
    attempt under the graph's RetryPolicy; ``run_token`` the owner token of the run's thread lease (None:
    no lease to renew); ``lease_ttl_ms`` how long the batch renews it for, in milliseconds; ``budgets`` the
    tool-call budgets its calls spend (:mod:`agentlab.core.batch.budgets`), counted per run under ``run_id``."""

    pool: Any
    safeguards: Safeguards
    thread_id: str
    tenant_id: str | None = None
    attempt: int = 1
    run_token: str | None = None
    lease_ttl_ms: int = 0
    provider: Any = None
    hooks: NodeHooks = field(default_factory=NodeHooks)
    events: EventLog = field(default_factory=lambda: EventLog(None))
    error_hints: ErrorHints | None = None
    budgets: CallBudgets | None = None
    run_id: str | None = None

    def spend(self, c: Call) -> Spend | None:
        """What ``c`` spends of the batch's budgets; None when no budget applies to it."""
        limits = self.budgets.limits(c.name) if self.budgets is not None else []
        return Spend(tuple(limits), self.thread_id, self.run_id) if limits else None

    def context(self, c: Call) -> ToolContext:
        """What ``c``'s handler is told besides its arguments."""
        return ToolContext(self.thread_id, c.call_id, self.safeguards, self.provider, self.tenant_id)

    def key(self, c: Call) -> str:
        """``c``'s ledger key (:func:`agentlab.core.batch.ledger.idempotency_key`)."""
        return key_of(c, self.thread_id, self.tenant_id)

    def translate(self, exc: BaseException, c: Call | None = None) -> Translation:
        """``exc`` as the model may be told it (the arguments ``c``'s tool takes may be named)."""
        allowed = c.spec.arg_names if c is not None and c.spec is not None else ()
        return translate(exc, allowed_args=allowed, sanitize=self.safeguards.sanitize, hints=self.error_hints)

    def record_commit_failed(self, tr: Translation) -> None:
        """The events row of a batch the server rolled back at COMMIT."""
        self.events.record("tools", "commit_failed", thread_id=self.thread_id, attempt=self.attempt,
                           sqlstate=tr.sqlstate, error_class=tr.error_class, detail=tr.detail)


class BatchStrategy(Protocol):
    """Runs the calls of a batch that passed preparation and returns what became of each.

    ``run`` reports a call APPLIED only once it is stored (after COMMIT returned), and raises an
    infrastructure error (:func:`agentlab.core.errors.is_infrastructure`) after rolling back, for the graph's
    RetryPolicy to decide."""

    async def run(self, batch: Batch, calls: list[Call]) -> Settled: ...
