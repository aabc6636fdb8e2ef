"""One transaction per batch of tool calls, a savepoint per call: the kit's pattern, in modules you can read.

Start with :mod:`~agentlab.core.batch.savepoints` (the reference path), then
:mod:`~agentlab.core.batch.node` (prepare -> strategy.run -> answer every call id -> events).

==================  ===========================================================================
module              what it holds
==================  ===========================================================================
``node``            :class:`TransactionalToolsNode`, the LangGraph node
``calls``           resolving and validating a batch's calls before any SQL
``results``         :class:`Outcome`, :class:`CallResult`, :class:`BatchResult`, ``Settled``
``ledger``          the idempotency ledger: keys, look-up, the row written with each call
``opening``         BEGIN, local settings, the thread's lock, the ledger look-up: one round trip
``timeouts``        a tool's own time budget, set and restored inside its call's savepoint
``budgets``         tool-call budgets per thread and per run, counted in the database in the batch
``strategy``        the ``BatchStrategy`` protocol and the ``Batch`` a strategy is given
``savepoints``      THE reference path: psycopg's nested ``conn.transaction()`` per call
``pipelined``       the same statements in one pipeline (an optimisation, tested equal)
``pipeline``        the pipeline mechanics the optimisation needs
``drafts``          deliberately wrong, for the ladder: autocommit, no savepoints
``choice``          the one place that maps safeguards to a strategy
==================  ===========================================================================
"""

from agentlab.core.batch.budgets import BudgetSpent, CallBudgets
from agentlab.core.batch.calls import MAX_CALL_ID_CHARS, Call
from agentlab.core.batch.ledger import LEDGER_INSERT, LEDGER_LOOKUP, LEDGER_LOOKUP_WITH_ARGS, idempotency_key
from agentlab.core.batch.node import TransactionalToolsNode
from agentlab.core.batch.opening import BEGIN, BEGIN_AT, BIND_THREAD_TENANT, COMMIT, ROLLBACK, THREAD_TENANT
from agentlab.core.batch.pipeline import SAVEPOINT
from agentlab.core.batch.pipelined import PipelinedStrategy
from agentlab.core.batch.results import BatchEnd, BatchResult, CallResult, Outcome, Settled
from agentlab.core.batch.savepoints import RELEASE_SAVEPOINT, ROLLBACK_TO_SAVEPOINT, SAVEPOINT_NAME, SavepointStrategy
from agentlab.core.batch.strategy import Batch, BatchStrategy, NodeHooks

__all__ = [
    "BEGIN", "BEGIN_AT", "BIND_THREAD_TENANT", "COMMIT", "LEDGER_INSERT", "LEDGER_LOOKUP", "LEDGER_LOOKUP_WITH_ARGS",
    "MAX_CALL_ID_CHARS", "RELEASE_SAVEPOINT", "ROLLBACK", "ROLLBACK_TO_SAVEPOINT", "SAVEPOINT", "SAVEPOINT_NAME",
    "THREAD_TENANT", "Batch", "BatchEnd", "BatchResult", "BatchStrategy", "BudgetSpent", "Call", "CallBudgets", "CallResult", "NodeHooks", "Outcome",
    "PipelinedStrategy", "SavepointStrategy", "Settled", "TransactionalToolsNode", "idempotency_key",
]
