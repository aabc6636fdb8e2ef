"""Episodes of the durable engines' agents, one call each: :func:`run_dbos_episode` plays billing's refund story
with the DBOS agent under a fault through the lab's one loop (``Yardstick.run("dbos:SHAPE", ...)``) and returns
a :class:`DbosEpisode`: the violations, DBOS's verdict, each life's exit status and the versions measured.

DBOS is an optional install (``pip install -r requirements-engines.txt``).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from agentlab.lab.clients.dbos_agent import CAP_S, SHAPES, DbosLife, engine_missing
from agentlab.lab.invariants import KINDS
from agentlab.lab.yardstick import ENGINE_FAULTS, Yardstick


@dataclass
class DbosEpisode:
    """One episode of the DBOS agent: what the checker found (``violations``, by kind in :meth:`counts`),
    what DBOS says (``verdict``: its status, ``recovery_attempts``, ``steps`` recorded), and how it ran
    (``lives``: one :class:`DbosLife` per process; ``wall_s`` in seconds for the whole episode, databases
    included; ``versions`` of the packages measured)."""

    shape: str
    fault: str
    seed: int
    scenario: str
    workflow_id: str
    customer_ids: list[int] = field(default_factory=list)
    system_database: str = ""
    verdict: dict = field(default_factory=dict)
    lives: list[DbosLife] = field(default_factory=list)
    violations: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def crashed(self) -> bool:
        return any(life.crashed for life in self.lives)

    @property
    def status(self) -> str:
        """DBOS's status of the workflow (``"SUCCESS"``, ``"ERROR"``, ``"PENDING"``...)."""
        return self.verdict.get("status", "")

    def counts(self) -> dict[str, int]:
        """Violations by kind: every kind of :data:`agentlab.lab.invariants.KINDS`, then any other."""
        c = Counter(v.kind for v in self.violations)
        return {**{k: c.get(k, 0) for k in KINDS}, **{k: n for k, n in c.items() if k not in KINDS}}


async def run_dbos_episode(harness, fault: str = "none", *, seed: int = 0, shape: str = "transactions",
                           cap_s: float = CAP_S) -> DbosEpisode:
    """Play billing's refund story with the DBOS agent of ``shape`` under ``fault``, then check it: one episode of
    the lab's one loop (``Yardstick.run("dbos:SHAPE", fault)``, :class:`agentlab.lab.clients.dbos_client.DbosClient`).

    Args:
        harness: an open :class:`agentlab.runtime.harness.Harness` on billing (its database, provider, domain).
        fault: one of :data:`agentlab.lab.yardstick.ENGINE_FAULTS`.
        seed: seeds the scripted model's tool call ids.
        shape: ``"transactions"`` (datasource transactions, the provider call a step) or ``"steps"``.
        cap_s: seconds each life may run before the lab kills it (DBOS then reports ``PENDING``).

    Returns:
        the :class:`DbosEpisode`, the DBOS system database already dropped.

    Raises:
        ValueError: an unknown fault or shape.
        agentlab.core.errors.AgentlabError: DBOS is not installed (the message says how to install it).
    """
    from agentlab.core.errors import AgentlabError

    if fault not in ENGINE_FAULTS:
        raise ValueError(f"the DBOS agent has no fault {fault!r}; choose one of: {', '.join(ENGINE_FAULTS)}")
    if shape not in SHAPES:
        raise ValueError(f"unknown DBOS agent shape {shape!r}; choose one of: {', '.join(SHAPES)}")
    if (missing := engine_missing()) is not None:
        raise AgentlabError(missing)
    t0 = time.perf_counter()
    runner = Yardstick(harness)
    runner.engine_cap_s = cap_s
    run = await runner.run(f"dbos:{shape}", fault, seed=seed, scenario="refund")
    if run.status != "ran":
        raise AgentlabError(f"the DBOS agent could not run {fault}: {run.reason}")
    engine = run.notes.get("engine", {})
    lives = [DbosLife(mode, code, wall_s) for mode, code, wall_s in engine.get("lives", [])]
    verdict = {k: engine[k] for k in ("status", "recovery_attempts", "steps") if k in engine}
    return DbosEpisode(shape, fault, seed, run.scenario.name, run.thread_id, list(run.customer_ids),
                       engine.get("system_database", ""), verdict, lives, list(run.violations), list(run.messages),
                       engine.get("versions", {}), time.perf_counter() - t0)
