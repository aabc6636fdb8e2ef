"""A tool's own time budget (``ToolSpec.timeout_ms``): its statements cancelled at it, inside its savepoint.

The batch's prelude sets ``statement_timeout`` for the whole transaction (:func:`agentlab.core.batch.opening.
prelude`). A tool that declares ``timeout_ms`` runs under its own, set and restored inside its call's
savepoint::

    SAVEPOINT tool_call
    SELECT set_config('statement_timeout', '<the tool's>ms', true)   SET LOCAL: the call's budget
    the tool's statements                                            each cancelled at it (SQLSTATE 57014)
    SELECT set_config('statement_timeout', '<the batch's>ms', true)  the batch's again
    the call's ledger row; RELEASE tool_call

Why the restore is written out: a ``SET LOCAL`` made inside a savepoint is undone by ``ROLLBACK TO`` but
kept by ``RELEASE``, until the transaction ends. Without it the next calls of the batch would run under this
tool's budget. A call whose statement was cancelled needs no restore: its ``ROLLBACK TO`` undoes the
``SET LOCAL`` with the rest of the call, and the call is answered ``FAILED [timeout]`` (its siblings per the
batch's policy).

A budget cannot fire after COMMIT: it is the server's own timer on the call's statements, PostgreSQL stops
it before a COMMIT commits (a deferred check that runs at COMMIT is not cut short), and a call is reported
APPLIED only once COMMIT returned. A client-side timer could fire while COMMIT is in flight and tell the
model "not applied" about a call that is stored; the kit has none.

The budget is PostgreSQL's ``statement_timeout``: each statement of the call is cancelled once it has run
``timeout_ms``; time the handler spends in Python between statements is not counted. A client-side deadline
over the whole call would not hold equally on both strategies: in a pipeline the handler's statements are
sent at once and run later, so a deadline checked as they are sent would fire on the reference path only.

Both strategies send these statements (the same ones, in the same order); a tool without a budget sends
none, so it costs no round trip. The budget is part of the ``timeouts`` safeguard: with it off (the ladder's
first rungs) no budget is set, as no batch ``statement_timeout`` is.

Sources: PostgreSQL docs "statement_timeout", "SET" (``SET LOCAL``: "The effects of SET LOCAL last only till
the end of the current transaction"; a savepoint rolled back undoes it), "SAVEPOINT".
"""

from __future__ import annotations

from dataclasses import dataclass

from agentlab.core.safeguards import Safeguards
from agentlab.core.toolspec import ToolSpec

SET_STATEMENT_TIMEOUT = "SELECT set_config('statement_timeout', %s, true)"


@dataclass(frozen=True)
class Budget:
    """The ``statement_timeout`` values a budgeted call sets (``call``) and restores (``batch``)."""

    call: str
    batch: str


def budget(spec: ToolSpec | None, safeguards: Safeguards) -> Budget | None:
    """The budget a call of ``spec`` runs under; None when it has none (no statement is sent then)."""
    if spec is None or spec.timeout_ms is None or not safeguards.timeouts:
        return None
    return Budget(f"{spec.timeout_ms}ms", f"{safeguards.statement_timeout_ms}ms")
