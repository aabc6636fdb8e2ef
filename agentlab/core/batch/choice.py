"""The one place that maps safeguards to a batch strategy.

With a transaction and savepoints the batch runs on the safe path; the pipelined strategy is the default
there because the bench measures it faster (the refund batch in 6 round trips against the reference's
18: ``python -m agentlab bench`` prints both), and a differential test holds it equal to the reference.
Pass ``strategy=SavepointStrategy()`` to :class:`agentlab.core.batch.node.TransactionalToolsNode` to run
the reference path itself. Weaker safeguards get the first drafts (:mod:`agentlab.core.batch.drafts`).
"""

from __future__ import annotations

from agentlab.core.batch.drafts import AutocommitDraft, NoSavepointsDraft
from agentlab.core.batch.pipelined import PipelinedStrategy
from agentlab.core.batch.strategy import BatchStrategy
from agentlab.core.safeguards import Safeguards


def strategy_for(safeguards: Safeguards) -> BatchStrategy:
    """The strategy a batch runs under ``safeguards``: pipelined savepoints on the safe path, else the draft
    of the rung (no transaction: autocommit; a transaction without savepoints: the C09 trap)."""
    if not safeguards.transaction:
        return AutocommitDraft()
    if not safeguards.savepoints:
        return NoSavepointsDraft()
    return PipelinedStrategy()
