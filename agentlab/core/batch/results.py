"""What a batch answers: one :class:`CallResult` per tool call id, gathered in a :class:`BatchResult`.

A call ends in one :class:`Outcome`; its ToolMessage (:meth:`CallResult.message`) carries the content the
model reads and, as its artifact, the outcome and the translator's category. :class:`Settled` is what a
:class:`agentlab.core.batch.strategy.BatchStrategy` returns for the calls it ran: a value, never filled-out
arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from langchain_core.messages import ToolMessage

from agentlab.core.errors import Category, Translation
from agentlab.core.messages import COMMIT_FAILED, FAILED_PREFIX, FAILED_TEMPLATE, NOT_APPLIED_TEMPLATE


class Outcome(str, Enum):
    """What happened to one tool call."""

    APPLIED = "applied"  # ran and is committed
    REPLAYED = "replayed"  # was applied earlier; the stored result was returned
    FAILED = "failed"  # refused or failed; the model is told why
    NOT_APPLIED = "not_applied"  # rolled back or never ran because of another call or the infrastructure


class BatchEnd(str, Enum):
    """How a batch's transaction ended (psycopg's ``Transaction`` keeps its state the same way)."""

    COMMITTED = "committed"  # COMMIT returned: every APPLIED call is stored
    ROLLED_BACK = "rolled_back"  # ROLLBACK (atomic policy after a failure), or the server turned COMMIT into one
    COMMIT_FAILED = "commit_failed"  # COMMIT itself failed (a deferred constraint, case C12): nothing is stored


@dataclass
class CallResult:
    """The outcome of one tool call and the ToolMessage content it produces. ``latency_ms``: the call's
    handler and ledger row, in milliseconds; ``started_ns``: when they started (``time.time_ns()``, where the
    call's trace span begins), 0 for a call that never ran."""

    index: int
    call_id: str
    tool: str
    outcome: Outcome
    content: str
    category: str | None = None
    result: dict | None = None
    translation: Translation | None = None
    latency_ms: float = 0.0
    started_ns: int = 0

    def undone(self, reason: str) -> CallResult:
        """This call, which ran and was released, rolled back with its batch: NOT APPLIED, its timing kept."""
        answer = not_applied(self.index, self.call_id, self.tool, reason)
        answer.latency_ms, answer.started_ns = self.latency_ms, self.started_ns
        return answer

    def message(self) -> ToolMessage:
        ok = self.outcome in (Outcome.APPLIED, Outcome.REPLAYED)
        return ToolMessage(
            content=self.content, tool_call_id=self.call_id, name=self.tool, status="success" if ok else "error",
            artifact={"outcome": self.outcome.value, "category": self.category},
        )


@dataclass
class BatchResult:
    """The outcome of one batch: one :class:`CallResult` per distinct tool call id, in call order."""

    results: list[CallResult]
    rolled_back: bool
    attempt: int = 1

    @property
    def messages(self) -> list[ToolMessage]:
        return [r.message() for r in self.results]

    def count(self, outcome: Outcome) -> int:
        return sum(r.outcome is outcome for r in self.results)


@dataclass(frozen=True)
class Settled:
    """What a strategy settled for the calls it was given: ``results`` by call index (a call it never
    reached is missing: the node answers it NOT APPLIED), how the transaction ended, and whether the
    batch counts as rolled back."""

    results: dict[int, CallResult] = field(default_factory=dict)
    end: BatchEnd = BatchEnd.COMMITTED
    rolled_back: bool = False

    @property
    def applied(self) -> bool:
        """True when some call of the batch is stored by this run (the ``after_commit`` hooks run then)."""
        return self.end is BatchEnd.COMMITTED and any(r.outcome is Outcome.APPLIED for r in self.results.values())


def not_applied(index: int, call_id: str, tool: str, reason: str) -> CallResult:
    """``NOT APPLIED: <reason>``: the call was rolled back or never ran, through no fault of its own."""
    return CallResult(index, call_id, tool, Outcome.NOT_APPLIED, NOT_APPLIED_TEMPLATE.format(reason=reason),
                      Category.NOT_APPLIED.value)


def failed(index: int, call_id: str, tool: str, tr: Translation) -> CallResult:
    """The call failed as ``tr`` says (NOT APPLIED when the translator says so, e.g. a lost lock)."""
    outcome = Outcome.NOT_APPLIED if tr.category is Category.NOT_APPLIED else Outcome.FAILED
    return CallResult(index, call_id, tool, outcome, tr.message, tr.category.value, translation=tr)


def commit_failed(index: int, call_id: str, tool: str, tr: Translation) -> CallResult:
    """A call of a batch whose COMMIT failed: nothing of it is applied, whatever it returned before."""
    reason = COMMIT_FAILED.format(reason=tr.reason.rstrip("."))
    content = FAILED_TEMPLATE.format(category=tr.category.value, reason=reason) if tr.message.startswith(
        FAILED_PREFIX) else tr.message
    return CallResult(index, call_id, tool, Outcome.FAILED, content, tr.category.value, translation=tr)
