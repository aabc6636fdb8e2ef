"""The yardstick's faults: the failure lab's catalog, applied to any agent, with nothing hooked into its code.

Most come from the catalog (:mod:`agentlab.lab.faults`) as they are: a hallucination is a change to
the script the model plays; a lock holder or a slow statement is another session or a trigger. Three are
rebuilt so they need no hook inside the agent: :class:`KillDuringStatement` (another connection kills
the backend the agent's UPDATE runs on), :class:`CrashAtCheckpoint` (the process dies in the
checkpointer, on the tools step's writes) and :class:`CrashAfterPayment` (dies after the provider
answered). The concurrency family (:data:`agentlab.lab.faults.CONCURRENCY_FAULTS`) runs the agent's
graph twice at once (:mod:`agentlab.lab.yardstick_concurrency`). :data:`YARDSTICK_FAULTS` lists them in
table order; :func:`register_fault` adds one (for a family built elsewhere). A fault that needs what an
agent does not expose is ``n/a`` for it (:meth:`YardstickFault.not_applicable`), never a pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterable
from dataclasses import dataclass

from agentlab.core.errors import SimulatedCrash
from agentlab.lab.agents import AgentSpec
from agentlab.lab.faults import (
    CONCURRENCY_FAULTS,
    SLOW_ARM,
    SLOW_DISARM,
    TERMINATE,
    DiesAfterPayment,
    Fault,
    SlowStatement,
    get_fault,
    slow_shot,
)
from agentlab.lab.nemesis.arguments import Hallucination
from agentlab.lab.nemesis.base import ended_event, poll_until
from agentlab.lab.nemesis.death import CRASH_INSIDE_STEP

NA = "n/a"
SCRIPTED_REASON = "a hallucinated argument is scripted; a real model's arguments are its own"
CONCURRENT_SCRIPTED_REASON = ("the two runs' calls are scripted (both at once, the amounts that collide); "
                              "a real model's calls are its own")

SLOW_PID = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 4242 AND objid = %s AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1"
)


@dataclass(frozen=True)
class KillDuringStatement(SlowStatement):
    """While the agent's UPDATE of the episode's first customer runs (held by the statement trigger of
    ``statement_timeout``, which marks it in ``pg_locks``), another connection terminates that backend
    (``pg_terminate_backend``): the agent's statement meets a dead connection, whatever its code."""

    def episode_safeguards(self, safeguards):
        return safeguards

    async def arm(self, run) -> None:
        await self.install(run.pool)
        customer = run.customer_ids[0]
        async with run.pool.connection() as conn:
            await conn.execute(slow_shot(customer))
            await conn.execute(SLOW_ARM, (customer,))

        over = ended_event(run)

        async def kill() -> bool:
            async with run.pool.connection() as conn:
                row = await (await conn.execute(SLOW_PID, (customer,))).fetchone()
                if row is None:
                    return False
                done = (await (await conn.execute(TERMINATE, (row[0],))).fetchone())[0]
                run.notes["killed_pid"], run.notes["terminated"] = row[0], bool(done)
                return True

        async def control() -> None:
            try:
                await poll_until(over, kill)
            finally:
                with contextlib.suppress(Exception):
                    async with run.pool.connection() as conn:
                        await conn.execute(SLOW_DISARM, (customer,))
                        await conn.execute(slow_shot(customer, drop=True))

        run.background.append(asyncio.create_task(control()))


@dataclass(frozen=True)
class CrashAtCheckpoint(Fault):
    """The process dies once the first tools step's ToolMessages reach the checkpointer, before they
    are written (the tools' effects are committed; the checkpoint is not); a new process resumes."""

    resumes = True

    async def arm(self, run) -> None:
        run.saver.crash_at_tool_writes.add(run.thread_id)


@dataclass(frozen=True)
class CrashAfterPayment(Fault):
    """The process that calls the provider dies after the provider did the work: the outbox worker for
    an agent with the kit's outbox, else the agent's process (its provider answers, then it dies)."""

    forget_keys: bool = False
    scenarios: tuple[str, ...] = ("refund", "invoice", "topup", "batch")
    resumes = True

    async def arm(self, run) -> None:
        if run.outbox:
            def die(row_id: int) -> None:
                if not run.notes.get("crashes"):
                    run.notes.setdefault("crashes", []).append("worker, after the provider call")
                    raise SimulatedCrash(f"simulated worker crash after the provider call (row {row_id})")

            run.worker.hooks.after_provider_call.append(die)
        else:
            run.agent_provider = DiesAfterPayment(run.network_provider, run, where="after the provider call",
                                                  note_payment=False)

    async def before_restart(self, run) -> None:
        if self.forget_keys:
            run.provider.clock.advance(run.provider.retention_s + 2 * 86400)


@dataclass(frozen=True)
class YardstickFault:
    """A fault as the yardstick applies it: ``fault`` (its phases), ``needs`` (hooks the agent must
    expose, else ``n/a``), ``scripted`` (a hallucination only the scripted model makes on cue;
    ``scripted_reason`` says so in the ``n/a`` cell of a real model)."""

    fault: Fault
    needs: frozenset[str] = frozenset()
    scripted: bool = False
    scripted_reason: str = SCRIPTED_REASON

    @property
    def name(self) -> str:
        return self.fault.name

    def not_applicable(self, agent: AgentSpec, *, scripted_model: bool) -> str | None:
        """Why this fault cannot apply to ``agent`` (one line), or None when it applies."""
        missing = sorted(self.needs - agent.exposes)
        if missing:
            return f"needs a hook inside the agent's tools step ({', '.join(missing)}), which {agent.name} does not expose"
        if self.scripted and not scripted_model:
            return self.scripted_reason
        return None


@dataclass(frozen=True)
class AsScripted(Fault):
    """The scenario as its script has it, hallucination included (refund: the customer id of the refund
    sent as text with a stray quote, ``"12'"``): the kit's seed story. ``domain``: the domain whose scenario
    it plays, as :func:`agentlab.runtime.domains.resolve_domain` takes it (None: the default, billing)."""

    domain: str | None = None

    def prepare(self, scenario, rng: random.Random):
        from agentlab.runtime.domains import resolve_domain

        return resolve_domain(self.domain).get_scenario(scenario.name)


_SCRIPTED = ("wrong_type", "negative_amount", "stray_quote", "other_tenant_id", "check_violation",
             "unique_violation", "fk_violation", "wrong_order")
YARDSTICK_FAULTS: dict[str, YardstickFault] = {
    "none": YardstickFault(get_fault("none")),
    "refund_story": YardstickFault(AsScripted(
        "refund_story", "hallucinated_argument", "the refund story as scripted: the refund's customer id arrives "
        "as \"12'\"; the model resends what it cannot tell was applied", "validation", ("refund",)), scripted=True),
    **{name: YardstickFault(get_fault(name), scripted=True) for name in _SCRIPTED},
    "lock_timeout": YardstickFault(get_fault("lock_timeout")),
    "statement_timeout": YardstickFault(get_fault("statement_timeout")),
    "backend_killed": YardstickFault(KillDuringStatement(
        "backend_killed", "backend_killed", "pg_terminate_backend from another connection during the customer's "
        "UPDATE", "transaction")),
    "crash_before_checkpoint": YardstickFault(CrashAtCheckpoint(
        "crash_before_checkpoint", "crash_before_checkpoint", "crash after the tools step, before its checkpoint; "
        "resume in a new process", "ledger")),
    "crash_mid_node": YardstickFault(get_fault("crash_mid_node"), needs=frozenset({"node_hooks"})),
    "provider_timeout": YardstickFault(get_fault("provider_timeout")),
    "worker_crash": YardstickFault(CrashAfterPayment(
        "worker_crash", "worker_crash", "the caller of the provider dies after the call, before recording it",
        "outbox")),
    **{name: YardstickFault(f, scripted=True, scripted_reason=CONCURRENT_SCRIPTED_REASON)
       for name, f in CONCURRENCY_FAULTS.items()},
}
"""The faults the yardstick runs, in table order."""

def over_the_provider_maximum(cents: int, scenario) -> int:
    """``cents`` with five zeros too many (2,500 sent as 250,000,000): over the payment provider's maximum per payment
    (:data:`agentlab.core.outbox.MAX_PAYMENT_CENTS`), so the provider refuses it every time it is sent."""
    return cents * 100_000


STUCK_RETRY = Hallucination(
    "stuck_retry", "hallucinated_argument", "the refund's amount arrives with five zeros too many; the payment "
    "provider refuses it (HTTP 400) every time it is sent, retried or not", "validation", ("refund",),
    tool="QueueRefund", field="amount_cents", corrupt=over_the_provider_maximum)
STUCK_RETRY_CAP_S = 10.0
"""How long an agent under ``stuck_retry`` may run (seconds): an engine that retries the refused request without
limit is still retrying then; its verdict is read at the cap."""

YARDSTICK_OPT_IN: dict[str, YardstickFault] = {
    "crash_inside_step": YardstickFault(CRASH_INSIDE_STEP),
    "stuck_retry": YardstickFault(STUCK_RETRY, scripted=True),
}
"""Faults the yardstick runs only when named (not in the default table): ``crash_inside_step`` starts a process
per life of the agent (:mod:`agentlab.lab.nemesis.death`), a few seconds an episode; ``stuck_retry`` waits up to
:data:`STUCK_RETRY_CAP_S` for an engine that retries without limit."""


def register_fault(fault: Fault, *, needs: Iterable[str] = (), scripted: bool = False) -> None:
    """Add ``fault`` (a :class:`agentlab.lab.faults.Fault`: ``prepare``, ``arm``, ``before_restart``,
    ``disarm`` on the episode's :class:`AgentRun`) to :data:`YARDSTICK_FAULTS`; ``needs`` names the hooks
    an agent must expose for it (else its cell is ``n/a``). Raises ValueError if the name is taken."""
    if fault.name in YARDSTICK_FAULTS or fault.name in YARDSTICK_OPT_IN:
        raise ValueError(f"the yardstick already has a fault named {fault.name!r}")
    YARDSTICK_FAULTS[fault.name] = YardstickFault(fault, frozenset(needs), scripted)


def get_yardstick_fault(name: str) -> YardstickFault:
    """The named fault. Raises ValueError naming the known ones."""
    try:
        return YARDSTICK_FAULTS[name] if name in YARDSTICK_FAULTS else YARDSTICK_OPT_IN[name]
    except KeyError:
        raise ValueError(f"the yardstick has no fault {name!r}; choose one of: "
                         f"{', '.join((*YARDSTICK_FAULTS, *YARDSTICK_OPT_IN))}") from None
