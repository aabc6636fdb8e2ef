"""Safeguards as data: every layer of the seed pattern can be switched off to show what it buys.

A :class:`Safeguards` value holds the switches; :data:`PRESETS` is the ladder from ``naive`` to
``full``, each rung adding one safeguard (DESIGN.md "Safeguards as data"). Build your own with
``preset("full").replace(ledger=False)``.

Against two conversations acting at once (:mod:`agentlab.core.run_lock`, the concurrency faults of
:mod:`agentlab.lab.concurrency`): ``row_locks`` (check-then-act tools lock the row they check),
``isolation_level`` (the batch's: read committed, repeatable read or serializable; a serialization
failure or deadlock, SQLSTATE 40001 / 40P01, is an infrastructure error the graph's RetryPolicy retries,
at most ``RETRY_ATTEMPTS`` times), ``run_lock`` (one run per thread at a time) and the natural keys of
``constraints``. ``full`` holds them all and stays at read committed: the row locks already make each
check-then-act tool's read and write one step; ``repeatable read`` and ``serializable`` are the
alternative the table compares (they refuse the late writer with 40001 instead of making it wait).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from agentlab.core.schema import LAX_SCHEMA, STRICT_SCHEMA

READ_COMMITTED, REPEATABLE_READ, SERIALIZABLE = "read committed", "repeatable read", "serializable"
ISOLATION_LEVELS = (READ_COMMITTED, REPEATABLE_READ, SERIALIZABLE)


class Policy(str, Enum):
    """What a batch keeps when one of its tool calls fails."""

    ATOMIC = "atomic"  # any failure rolls back the whole batch
    PARTIAL = "partial"  # keep the calls that succeeded (each in its own savepoint)


@dataclass(frozen=True)
class Safeguards:
    """The switches of one run. Durations are in milliseconds, as PostgreSQL's settings take them.

    Raises:
        ValueError: on a combination that cannot exist (savepoints or a ledger without a transaction;
            isolation without the strict schema or without a transaction).
    """

    constraints: bool = True  # CHECK / UNIQUE / FOREIGN KEY in the schema (else the ``lax`` copy)
    validation: bool = True  # strict pydantic argument models before any SQL
    transaction: bool = True  # one transaction per batch (else autocommit per statement)
    savepoints: bool = True  # a SAVEPOINT per tool call
    policy: Policy = Policy.ATOMIC
    ledger: bool = True  # idempotency ledger: replay stored results instead of applying twice
    outbox: bool = True  # record external effects as outbox rows (else call the provider inline)
    sanitize: bool = True  # model-facing errors from the translator (else raw exception text)
    lock: bool = True  # pg_advisory_xact_lock per thread
    timeouts: bool = True  # SET LOCAL statement_timeout / lock_timeout
    isolation: bool = True  # tool SQL runs as the least-privilege agent role, rows limited to the thread's tenant
    row_locks: bool = True  # check-then-act tools lock the row they check (SELECT ... FOR UPDATE)
    run_lock: bool = True  # one writer per thread for a whole run: a lease row (agentlab.core.run_lock), renewed
    # inside each batch's transaction (with transaction=False it is only taken and released around the run)
    isolation_level: str = READ_COMMITTED  # the batch transaction's isolation level (BEGIN ISOLATION LEVEL ...)
    max_rollbacks: int = 3  # consecutive rolled-back batches before escalation to a human
    statement_timeout_ms: int = 2000
    lock_timeout_ms: int = 300
    run_lock_wait_ms: int = 0  # how long a second run on a busy thread waits before it is refused
    name: str = "custom"

    def __post_init__(self) -> None:
        if not self.transaction and (self.savepoints or self.ledger):
            raise ValueError("savepoints and the ledger need a transaction (transaction=True)")
        if self.isolation and not (self.constraints and self.transaction):
            raise ValueError(
                "isolation needs constraints=True (row-level security lives on the strict tables, not the lax "
                "copy) and transaction=True (the role and the tenant are set locally in the batch transaction); "
                "or pass isolation=False"
            )
        if self.isolation_level not in ISOLATION_LEVELS:
            raise ValueError(f"isolation_level must be one of: {', '.join(ISOLATION_LEVELS)}")
        if self.isolation_level != READ_COMMITTED and not self.transaction:
            raise ValueError("an isolation level other than read committed needs a transaction (transaction=True)")
        if self.run_lock_wait_ms < 0:
            raise ValueError("run_lock_wait_ms must be at least 0")
        if self.max_rollbacks < 1:
            raise ValueError("max_rollbacks must be at least 1")
        object.__setattr__(self, "policy", Policy(self.policy))

    @property
    def schema(self) -> str:
        """The schema holding the business tables this run writes to."""
        return STRICT_SCHEMA if self.constraints else LAX_SCHEMA

    def replace(self, **changes) -> Safeguards:
        """A copy with ``changes`` applied, named ``custom`` unless a name is given."""
        changes.setdefault("name", "custom")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["policy"] = self.policy.value
        return d


_NAIVE = Safeguards(
    constraints=False, validation=False, transaction=False, savepoints=False, policy=Policy.PARTIAL,
    ledger=False, outbox=False, sanitize=False, lock=False, timeouts=False, isolation=False, row_locks=False,
    run_lock=False, name="naive",
)

PRESETS: dict[str, Safeguards] = {
    "naive": _NAIVE,
    "constraints": _NAIVE.replace(name="constraints", constraints=True),
    "validated": _NAIVE.replace(name="validated", constraints=True, validation=True),
    "transaction": _NAIVE.replace(
        name="transaction", constraints=True, validation=True, transaction=True, policy=Policy.ATOMIC
    ),
    "savepoints": _NAIVE.replace(
        name="savepoints", constraints=True, validation=True, transaction=True, savepoints=True, policy=Policy.ATOMIC
    ),
    "ledger": _NAIVE.replace(
        name="ledger", constraints=True, validation=True, transaction=True, savepoints=True, policy=Policy.ATOMIC,
        ledger=True,
    ),
    "full": Safeguards(name="full"),
}

PRESET_NOTES: dict[str, str] = {
    "naive": "autocommit per statement, raw errors, no ledger, provider called inline: what a first draft does.",
    "constraints": "adds CHECK / UNIQUE / FOREIGN KEY: guards balances and natural keys against any caller.",
    "validated": "adds strict argument models: a hallucinated type or negative amount is refused before any SQL.",
    "transaction": "adds one transaction per batch: a failing call cannot leave its siblings half applied.",
    "savepoints": "adds a savepoint per call: each failure is attributed to its call and nothing is reported "
    "applied before COMMIT.",
    "ledger": "adds the idempotency ledger: a node retry or resume after a crash replays stored results.",
    "full": "adds the outbox, sanitized errors, an advisory lock per thread, timeouts, and tenant isolation "
    "(a least-privilege role, row-level security by tenant): the seed's pattern.",
}


def preset(name: str) -> Safeguards:
    """The named preset. Raises ValueError naming the known presets."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
