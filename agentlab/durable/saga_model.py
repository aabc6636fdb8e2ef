"""The saga's vocabulary: run and step statuses, the errors a runner raises, a step and its context, a saga's
definition, the backoff between attempts, the hooks a test or a fault sets, and the report of a run as stored
(:mod:`agentlab.durable.saga` runs them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from agentlab.core.errors import AgentlabError, is_infrastructure
from agentlab.core.hooks import Hook


class RunStatus(str, Enum):
    """A saga run's state."""

    RUNNING = "running"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    COMPENSATED = "compensated"
    PARKED = "parked"  # waiting for a person; ``parked_reason`` says why


class StepStatus(str, Enum):
    """A saga step's state."""

    PENDING = "pending"
    RUNNING = "running"  # a step outside a transaction has started; its result is not stored yet
    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATED = "compensated"
    SENT_BUT_UNWOUND = "sent_but_unwound"  # an external effect that a correction answered
    COMPENSATION_FAILED = "compensation_failed"


class SagaBusy(AgentlabError):
    """Raised when another runner holds the run (its advisory lock)."""


class SagaFenced(SagaBusy):
    """Raised when a runner's transaction finds the run claimed by another runner (its owner token
    replaced) or moved to another status or direction: that transaction rolls back, nothing of it is kept."""


class SagaError(AgentlabError):
    """Raised when a run does not match the definition given (another saga, other steps), or a run key
    is reused with another input."""


class AbortRefused(SagaError):
    """Raised when :meth:`SagaRunner.abort` cannot compensate: a pivot step (the point of no return)
    has committed, so the run can only go forward (:meth:`SagaRunner.resume` finishes it)."""


@dataclass
class StepContext:
    """What a step's action or compensation gets.

    ``conn`` is the step's open transaction (None for a step with ``in_transaction=False``);
    ``results`` maps the names of completed steps to their stored results.
    """

    run_id: int
    run_key: str
    position: int
    step: str
    attempt: int
    input: dict
    results: dict[str, dict]
    conn: Any = None

    def key(self, suffix: str = "") -> str:
        """A dedupe key for an effect of this step: ``saga:<run_id>:<position>[:<suffix>]``."""
        return f"saga:{self.run_id}:{self.position}" + (f":{suffix}" if suffix else "")


Action = Callable[[StepContext], Awaitable[dict]]
Compensation = Callable[[StepContext, dict], Awaitable[dict | None]]


@dataclass(frozen=True)
class Step:
    """One step.

    Attributes:
        name: unique within the saga.
        action: ``await action(ctx) -> dict`` (JSON-ready): the step's effect and its result.
        compensate: ``await compensate(ctx, args)`` undoes (or, for an external step, corrects) the
            effect; ``args`` is what was recorded when the step completed. None: nothing to undo.
        in_transaction: False for work that must not hold a transaction open (a model call).
        external: the effect leaves the system (a message, a payment): it can only be corrected.
        compensation_args: what to record for the compensation, from the result (default: the result).
        pivot: the point of no return: an effect nothing undoes (money paid out). Once it committed,
            the run only goes forward: abort is refused, a later permanent failure parks the run.
            ``compensate=None`` alone means "nothing to undo", which a compensation may skip.
    """

    name: str
    action: Action
    compensate: Compensation | None = None
    in_transaction: bool = True
    external: bool = False
    compensation_args: Callable[[dict, StepContext], dict] | None = None
    pivot: bool = False

    def compensation_record(self, result: dict, ctx: StepContext) -> dict:
        """The compensating action stored with the completed step: ``{"undo": name | None, "args": {...}}``."""
        if self.compensate is None:
            return {"undo": None, "args": {}}
        args = self.compensation_args(result, ctx) if self.compensation_args else result
        return {"undo": getattr(self.compensate, "__name__", "compensate"), "args": args}


@dataclass(frozen=True)
class SagaDefinition:
    """A named list of steps (positions start at 1)."""

    name: str
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError("step names must be unique within a saga")
        if any(s.pivot and s.compensate is not None for s in self.steps):
            raise ValueError("a pivot step cannot be undone: give it no compensation")


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff: attempt ``n`` waits ``min(cap_s, initial_s * factor**(n-1))`` seconds."""

    max_attempts: int = 4
    initial_s: float = 0.05
    factor: float = 2.0
    cap_s: float = 1.0

    def delay_s(self, attempt: int) -> float:
        return min(self.cap_s, self.initial_s * self.factor ** (attempt - 1))


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying unchanged (:func:`agentlab.core.errors.is_infrastructure`)."""
    return isinstance(exc, Exception) and is_infrastructure(exc)


@dataclass
class SagaHooks:
    """Fault-injection points. ``after_step(position, name)`` after a step committed;
    ``after_failure(position, attempt, exc)`` after a failed attempt was recorded;
    ``before_compensation(position, name)`` before each compensation attempt's transaction."""

    after_step: list[Hook] = field(default_factory=list)
    after_failure: list[Hook] = field(default_factory=list)
    before_compensation: list[Hook] = field(default_factory=list)


@dataclass
class SagaReport:
    """A run as the database holds it after the runner returned."""

    run_id: int
    run_key: str
    saga: str
    status: str
    direction: str
    failed_step: int | None
    parked_reason: str | None
    steps: list[dict]
    compensations: list[int]  # positions, in the order their compensations committed
    compensation_needed: list[dict]

    def as_dict(self) -> dict:
        return {
            "run_id": self.run_id, "run_key": self.run_key, "saga": self.saga, "status": self.status,
            "direction": self.direction, "failed_step": self.failed_step, "parked_reason": self.parked_reason,
            "steps": self.steps, "compensations": self.compensations,
            "compensation_needed": [{k: v for k, v in row.items() if k != "created_at"}
                                    for row in self.compensation_needed],
        }


def describe_step(exc: BaseException) -> tuple[str, str]:
    """(error class, redacted one-line text) of an exception, for people: never shown to a model."""
    from agentlab.core.redact import redact

    first = (str(exc).strip().splitlines() or [""])[0]  # the primary message; CONTEXT lines go to the log
    return f"{type(exc).__module__}.{type(exc).__qualname__}", redact(f"{type(exc).__name__}: {first}")[:500]
