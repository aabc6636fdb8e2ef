"""Replay tau2's golden actions through the port and compare with tau2's own end states.

- :func:`replay_actions`: run a list of tau2 actions (``{"action_id", "name", "arguments"}``) through
  :mod:`.tools`, each in its own ``conn.transaction()`` (a real transaction on an autocommit
  connection, a savepoint inside an open one); an exception rolls that action back and is recorded,
  as tau2's evaluator swallows it.
- :func:`check_tasks`: for each task, replay inside an outer transaction that is always rolled back
  (so every task starts from the loaded state), export, hash, and compare the state's hash, the
  actions that raised and what each action returned with ``data/retail/expected_hashes.json``.

The connection must hold schema ``retail`` loaded with ``db.json`` and no transaction of its own
when :func:`check_tasks` is called.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from agentlab.domains.retail.export import canonical_hash, export_state
from agentlab.domains.retail.load import read_expected_hashes, read_tasks
from agentlab.domains.retail.tools import call


@dataclass
class ActionOutcome:
    action_id: str
    name: str
    result_hash: str | None  # canonical hash of the return value; None when it raised
    error: BaseException | None = None


@dataclass
class TaskCheck:
    task_id: str
    state_hash: str
    expected_hash: str
    raised: list[str]
    expected_raised: list[str]
    result_mismatches: list[str]  # action ids whose return value differs from tau2's
    outcomes: list[ActionOutcome] = field(repr=False, default_factory=list)

    @property
    def state_matches(self) -> bool:
        return self.state_hash == self.expected_hash

    @property
    def ok(self) -> bool:
        return self.state_matches and self.raised == self.expected_raised and not self.result_mismatches


@dataclass
class CheckReport:
    tasks: list[TaskCheck]
    seconds: float

    @property
    def matched(self) -> int:
        return sum(t.ok for t in self.tasks)

    @property
    def mismatched(self) -> list[str]:
        return [t.task_id for t in self.tasks if not t.ok]

    def summary(self) -> str:
        return (f"{self.matched}/{len(self.tasks)} tasks match tau2 (state hash, refused actions, return values) "
                f"in {self.seconds:.1f} s" + (f"; mismatched: {', '.join(self.mismatched)}" if self.mismatched else ""))


async def replay_actions(conn: psycopg.AsyncConnection, actions: list[dict], ctx: Any = None) -> list[ActionOutcome]:
    """Run ``actions`` in order, each in its own ``conn.transaction()``; exceptions are recorded, not raised."""
    outcomes = []
    for action in actions:
        try:
            async with conn.transaction():
                result = await call(conn, action["name"], action["arguments"], ctx)
        except Exception as exc:  # noqa: BLE001 - tau2's evaluator swallows every exception
            outcomes.append(ActionOutcome(action["action_id"], action["name"], None, exc))
        else:
            outcomes.append(ActionOutcome(action["action_id"], action["name"], canonical_hash(result)))
    return outcomes


async def check_tasks(conn: psycopg.AsyncConnection, task_ids: list[str] | None = None, *, ctx: Any = None,
                      tasks: list[dict] | None = None, expected: dict | None = None) -> CheckReport:
    """Replay ``task_ids`` (default: all 114), each rolled back afterwards, and compare with tau2."""
    tasks = read_tasks() if tasks is None else tasks
    expected = read_expected_hashes() if expected is None else expected
    by_id = {t["id"]: t for t in tasks}
    started = time.perf_counter()
    checks = []
    for task_id in task_ids if task_ids is not None else list(by_id):
        actions = (by_id[task_id].get("evaluation_criteria") or {}).get("actions") or []
        async with conn.transaction(force_rollback=True):
            outcomes = await replay_actions(conn, actions, ctx)
            state_hash = canonical_hash(await export_state(conn))
        want_results = expected["result_hashes"][task_id]
        checks.append(TaskCheck(
            task_id=task_id,
            state_hash=state_hash,
            expected_hash=expected["hashes"][task_id],
            raised=[o.action_id for o in outcomes if o.error is not None],
            expected_raised=[r["action_id"] for r in expected["raised"].get(task_id, [])],
            result_mismatches=[o.action_id for o, want in zip(outcomes, want_results) if o.result_hash != want],
            outcomes=outcomes,
        ))
    return CheckReport(checks, time.perf_counter() - started)
