"""Faults beyond one transaction: a saga's lock holder killed, an abort past the point of no return,
retention racing a live thread. Each runs under ``full`` and under the weaker setting its case
describes, and :func:`check_payout_run` / :func:`check_retention_race` count what it broke.

==========================  ==================  ==========================================================
fault                       weaker setting      mechanism
==========================  ==================  ==========================================================
``lock_holder_killed``      ``unfenced``        runner A backs off before retrying the pivot step (a second
                                                session holds the customer's row); another session runs
                                                ``pg_terminate_backend`` on the backend holding A's session
                                                advisory lock; runner B takes the run over and aborts it
                                                (case C32). ``unfenced``: ``SagaRunner(fencing=False)``, the
                                                session lock is the only guard
``abort_after_pivot``       ``no_pivot``        the process dies right after the pivot step (money paid out)
                                                committed; an operator aborts the run stuck in ``running``
                                                (case C31). ``no_pivot``: the same steps, none marked as the
                                                point of no return
``retention_races_thread``  ``unguarded``       retention classifies an old finished thread for deletion;
                                                the user comes back and the run stops on an approval
                                                ``interrupt()``; retention then acts (case C33).
                                                ``unguarded``: ``apply_retention(guarded=False)``
==========================  ==================  ==========================================================

A saga fault needs a payout-shaped saga (the demos' ``store_credit_payout``): input ``customer_id``,
``amount_cents``, ``reference``, ``email``; a step that holds the amount from the customer's credit;
a pivot step that refunds it to the card. Behind a transaction-mode pooler (a harness opened with
``behind_pooler=True``) the runners take no session lock, so ``lock_holder_killed`` has none to kill:
runner B takes the run over all the same.

Violation kinds (:data:`DURABLE_KINDS`), read from the database, the provider and the notifier:

=====================  ==================================================================================
``paid_twice``         store credit left plus refunds paid to the card exceed the opening credit
``payment_count``      refunds at the provider differ from what was meant: more than one for a payout, or
                       fewer than a reviewer approved
``mixed_direction``    a run holds steps compensated (or sent but unwound) and steps completed at once
``false_correction``   the customer was sent a correction saying the payout failed, and it was paid
``approval_lost``      an approval request is pending on a thread whose checkpoints are gone: nobody can
                       answer it
=====================  ==================================================================================

``await run_durable_fault(h, "lock_holder_killed", "unfenced", saga=saga)``; :func:`durable_fault_table`
runs every fault under both settings.

Sources: PostgreSQL docs "Advisory Locks", "pg_terminate_backend"; M. Kleppmann, "How to do distributed
locking" (fencing tokens); Azure Architecture Center, "Saga distributed transactions pattern" (pivot).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from agentlab.core.domain import Violation
from agentlab.core.errors import SimulatedCrash
from agentlab.durable.saga import AbortRefused, Backoff, SagaDefinition, SagaFenced, SagaRunner
from agentlab.lab.row_lock import RowLock
from agentlab.sim.provider import customer_ref

DURABLE_KINDS: tuple[str, ...] = ("paid_twice", "payment_count", "mixed_direction", "false_correction",
                                  "approval_lost")
OPENING_CENTS, AMOUNT_CENTS = 5000, 2000
RUNNER = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=4, initial_s=0.01),
          "compensation_retry": Backoff(max_attempts=2, initial_s=0.01)}

RUN_LOCK_HOLDER = """
SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('saga:' || %s::text, 0)
"""
TERMINATE = "SELECT pg_terminate_backend(%s, 5000)"
RUN_OF_KEY = "SELECT id FROM saga_runs WHERE run_key = %s"
RUN_RECORDS = """
SELECT r.run_key, r.status,
       (SELECT array_agg(s.status ORDER BY s.position) FROM saga_steps s WHERE s.run_id = r.id),
       (SELECT credit_cents FROM customers WHERE id = %(customer)s),
       (SELECT count(*) FROM provider.payments WHERE customer = %(ref)s AND kind = 'refund'),
       (SELECT coalesce(sum(amount_cents), 0) FROM provider.payments WHERE customer = %(ref)s AND kind = 'refund'),
       (SELECT count(*) FILTER (WHERE corrects IS NULL) FROM notify.messages WHERE recipient = %(email)s),
       (SELECT count(*) FILTER (WHERE corrects IS NOT NULL) FROM notify.messages WHERE recipient = %(email)s)
FROM saga_runs r WHERE r.id = %(run)s
"""
THREAD_RECORDS = """
SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %(thread)s),
       (SELECT count(*) FROM approval_requests WHERE thread_id = %(thread)s AND status = 'pending'),
       (SELECT count(*) FROM provider.payments WHERE customer = %(ref)s AND kind = 'refund')
"""
BACKDATE_THREAD = ("UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', "
                   "to_jsonb(((checkpoint ->> 'ts')::timestamptz - %s::interval)::text)) WHERE thread_id = %s")
UNDONE = ("compensated", "sent_but_unwound")


@dataclass(frozen=True)
class DurableFault:
    """One named fault beyond one transaction.

    Attributes:
        name, family, title: as in :mod:`agentlab.lab.faults`.
        guarded_by: what holds it under ``full``.
        weaker: the name of the weaker setting its case describes; ``weaker_title`` says what it is.
        case: the case it reproduces.
    """

    name: str
    family: str
    title: str
    guarded_by: str
    weaker: str
    weaker_title: str
    case: str
    needs_saga: bool = True


@dataclass
class DurableRun:
    """One fault under one setting: what the database, the provider and the notifier hold, and what broke."""

    fault: str
    setting: str
    effects: dict
    violations: list[Violation]
    notes: dict = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """``{kind: count}`` for every kind of :data:`DURABLE_KINDS`, zeros included."""
        got = Counter(v.kind for v in self.violations)
        return {k: got.get(k, 0) for k in DURABLE_KINDS}


DURABLE_FAULTS: dict[str, DurableFault] = {f.name: f for f in (
    DurableFault("lock_holder_killed", "killed_lock_holder",
                 "the backend holding a saga runner's session lock is terminated; a second runner takes over",
                 "fencing (owner token checked on the locked run row)", "unfenced",
                 "the session advisory lock is the only guard (SagaRunner(fencing=False))", "C32"),
    DurableFault("abort_after_pivot", "abort_after_pivot",
                 "the process dies right after the pivot step committed; an operator aborts the run",
                 "the point of no return (pivot step)", "no_pivot",
                 "the same steps, none marked as the point of no return", "C31"),
    DurableFault("retention_races_thread", "retention_race",
                 "retention classifies an old thread; the user comes back to it before the delete",
                 "guarded retention (each delete checked against its classification)", "unguarded",
                 "retention deletes what it classified (apply_retention(guarded=False))", "C33", needs_saga=False),
)}


def get_durable_fault(name: str) -> DurableFault:
    """The named fault. Raises ValueError naming the known ones."""
    try:
        return DURABLE_FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; choose one of: {', '.join(DURABLE_FAULTS)}") from None


# --------------------------------------------------------------------------- the checks

async def check_payout_run(h, run_id: int, customer_id: int, opening_cents: int, email: str) -> tuple[dict, list]:
    """What one payout run left (after the outbox drained) and its violations: ``(effects, violations)``.

    ``effects``: ``status``, ``steps`` (statuses by position), ``credit_deducted_cents``,
    ``refunds_at_provider``, ``refunded_cents``, ``notices_sent``, ``corrections_sent``.
    """
    await h.worker.drain()
    async with h.pool.connection() as conn:
        key, status, steps, credit, refunds, refunded, notices, corrections = await (await conn.execute(
            RUN_RECORDS, {"run": run_id, "customer": customer_id, "ref": customer_ref(customer_id),
                          "email": email})).fetchone()
    refunded = int(refunded)
    effects = {"status": status, "steps": list(steps), "credit_deducted_cents": opening_cents - credit,
               "refunds_at_provider": refunds, "refunded_cents": refunded, "notices_sent": notices,
               "corrections_sent": corrections}
    out: list[Violation] = []
    if credit + refunded > opening_cents:
        out.append(Violation("paid_twice", key, f"customer {customer_id}: {refunded} cents refunded to the card "
                             f"and the store credit back to {credit} of {opening_cents} cents"))
    if refunds > 1:
        out.append(Violation("payment_count", key, f"customer {customer_id}: {refunds} refunds at the provider, "
                             "intended at most 1"))
    if any(s in UNDONE for s in steps) and "completed" in steps:
        out.append(Violation("mixed_direction", key, f"run {run_id}: steps {list(steps)}"))
    if corrections and refunds:
        out.append(Violation("false_correction", key, f"customer {customer_id}: told the payout failed "
                             f"({corrections} correction(s)), and {refunded} cents were refunded"))
    return effects, out


async def check_retention_race(h, thread_id: str, customer_id: int, approved_refunds: int) -> tuple[dict, list]:
    """What the thread and the customer hold after the reviewer answered: ``(effects, violations)``.

    Call it once right after retention acted (``approved_refunds=None`` skips the payment check) to see
    an approval left without its thread, and again after the reviewer's answer.
    """
    await h.worker.drain()
    async with h.pool.connection() as conn:
        checkpoints, pending, refunds = await (await conn.execute(
            THREAD_RECORDS, {"thread": thread_id, "ref": customer_ref(customer_id)})).fetchone()
    effects = {"checkpoints": checkpoints, "pending_approvals": pending, "refunds_at_provider": refunds}
    out: list[Violation] = []
    if pending and not checkpoints:
        out.append(Violation("approval_lost", thread_id, f"{pending} approval request(s) pending on a thread "
                             "with 0 checkpoints: nobody can answer them"))
    if approved_refunds is not None and refunds != approved_refunds:
        out.append(Violation("payment_count", thread_id, f"customer {customer_id}: {refunds} refunds at the "
                             f"provider, {approved_refunds} approved"))
    return effects, out


# --------------------------------------------------------------------------- the faults

def _payout_input(customer_id: int, amount_cents: int, reference: str) -> dict:
    return {"customer_id": customer_id, "amount_cents": amount_cents, "reference": reference,
            "email": f"customer-{customer_id}@example.com"}


async def _customer(h, name: str, credit_cents: int) -> int:
    """A new customer of the harness's domain for one payout (its ``create_rows``, in ``public``): the approval
    story's customer (tenant ``acme``), named ``name``, with ``credit_cents`` of store credit."""
    from agentlab.core.safeguards import preset
    from agentlab.durable.approval import APPROVAL

    spec = dataclasses.replace(APPROVAL.customers[0], name=name, credit_cents=credit_cents)
    (cid,) = await h.create_customers(dataclasses.replace(APPROVAL, customers=(spec,)), preset("full"))
    return cid


def _pivot_position(saga: SagaDefinition) -> int:
    pivots = [n for n, s in enumerate(saga.steps, 1) if s.pivot]
    if not pivots:
        raise ValueError(f"saga {saga.name!r} has no pivot step (point of no return) for this fault")
    return pivots[-1]


def without_pivot(saga: SagaDefinition) -> SagaDefinition:
    """The same saga with no step marked as the point of no return (the weaker setting of C31)."""
    return SagaDefinition(saga.name, tuple(dataclasses.replace(s, pivot=False) for s in saga.steps))


async def _lock_holder_killed(h, saga: SagaDefinition, weaker: bool, notes: dict) -> tuple[int, int, str]:
    pivot = _pivot_position(saga)
    cid = await _customer(h, "Killed lock holder", OPENING_CENTS)
    data = _payout_input(cid, AMOUNT_CENTS, f"LAB-KILL-{cid}")
    key = f"lab:lock_holder_killed:{cid}"
    pooled = bool(getattr(h, "behind_pooler", False))
    kwargs = {**RUNNER, "behind_pooler": pooled, "fencing": not weaker}
    a, b = SagaRunner(h.pool, saga, **kwargs), SagaRunner(h.pool, saga, **kwargs)
    held: list[RowLock] = []

    async def busy_before_the_pivot(position: int, name: str) -> None:
        if position == pivot - 1:
            held.append(await RowLock.acquire(h.url, cid))

    async def kill_and_take_over(position: int, attempt: int, exc: BaseException) -> None:
        if position != pivot or "b_status" in notes:
            return
        while held:
            await held.pop().release()
        async with h.pool.connection() as conn:
            run_id = (await (await conn.execute(RUN_OF_KEY, (key,))).fetchone())[0]
            pids = [r[0] for r in await (await conn.execute(RUN_LOCK_HOLDER, (run_id,))).fetchall()]
            notes["lock_holders"] = len(pids)
            notes["terminated"] = [bool((await (await conn.execute(TERMINATE, (p,))).fetchone())[0]) for p in pids]
        notes["b_status"] = (await b.abort(run_id, "a second runner took the run over")).status

    a.hooks.after_step.append(busy_before_the_pivot)
    a.hooks.after_failure.append(kill_and_take_over)
    try:
        report = await a.start(key, data)
        notes["a_outcome"] = f"finished: {report.status}"
    except SagaFenced:
        notes["a_outcome"] = "fenced (its transaction rolled back)"
    finally:
        while held:
            await held.pop().release()
    async with h.pool.connection() as conn:
        run_id = (await (await conn.execute(RUN_OF_KEY, (key,))).fetchone())[0]
    return run_id, cid, data["email"]


async def _abort_after_pivot(h, saga: SagaDefinition, weaker: bool, notes: dict) -> tuple[int, int, str]:
    pivot = _pivot_position(saga)
    played = without_pivot(saga) if weaker else saga
    cid = await _customer(h, "Abort after the pivot", OPENING_CENTS)
    data = _payout_input(cid, AMOUNT_CENTS, f"LAB-ABORT-{cid}")
    key = f"lab:abort_after_pivot:{cid}"
    pooled = bool(getattr(h, "behind_pooler", False))
    first = SagaRunner(h.pool, played, **RUNNER, behind_pooler=pooled)

    def die_after_the_pivot(position: int, name: str) -> None:
        if position == pivot:
            raise SimulatedCrash(f"the process dies right after step {pivot} ({name}) committed")

    first.hooks.after_step.append(die_after_the_pivot)
    try:
        await first.start(key, data)
    except SimulatedCrash:
        notes["crashed_after_step"] = pivot
    async with h.pool.connection() as conn:
        run_id = (await (await conn.execute(RUN_OF_KEY, (key,))).fetchone())[0]
    operator = SagaRunner(h.pool, played, **RUNNER, behind_pooler=pooled)
    try:
        notes["abort"] = (await operator.abort(run_id, "stuck in running")).status
    except AbortRefused:
        notes["abort"] = "refused"
        notes["resume"] = (await operator.resume(run_id)).status
    return run_id, cid, data["email"]


async def _retention_races_thread(h, weaker: bool, notes: dict) -> tuple[dict, list]:
    import uuid

    from langchain_core.messages import HumanMessage

    from agentlab.core.graph import run_config
    from agentlab.core.safeguards import preset
    from agentlab.durable.approval import APPROVAL, ApprovalPolicy
    from agentlab.durable.approval_review import resume_command
    from agentlab.durable.retention import RetentionPolicy, RetentionReport, apply_retention
    from agentlab.sim.model import ScriptedChatModel

    sg = preset("full")
    ids = await h.create_customers(APPROVAL, sg)
    thread = f"lab-retention-{uuid.uuid4().hex[:12]}"
    config = run_config(thread, tenant_id=APPROVAL.tenant_id)
    chat = h.graph(sg, ScriptedChatModel(script=[], seed=0, final_text="Hello! How can I help?"))
    await chat.ainvoke({"messages": [HumanMessage("Hi")]}, config, durability="sync")  # an old, finished chat
    async with h.pool.connection() as conn:
        await conn.execute(BACKDATE_THREAD, ("100 days", thread))
    seen = await apply_retention(h.saver, h.pool, RetentionPolicy(), dry_run=True)
    plan = RetentionReport(deleted=[thread] if thread in seen.deleted else [],
                           pruned=[thread] if thread in seen.pruned else [],
                           classified={thread: seen.classified[thread]})  # this thread only
    notes["classified"] = "delete" if plan.deleted else "prune" if plan.pruned else "keep"

    # the user comes back before retention acts: the run stops on an approval for two refunds
    graph = h.graph(sg, ScriptedChatModel(script=APPROVAL.script(ids), seed=0), approval=ApprovalPolicy())
    await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config, durability="sync")
    report = await apply_retention(h.saver, h.pool, RetentionPolicy(), plan=plan, guarded=not weaker)
    notes["retention"] = {"deleted": len(report.deleted), "left_alone": len(report.left_alone)}
    after_retention, lost = await check_retention_race(h, thread, ids[0], None)
    notes["after_retention"] = after_retention
    try:
        await graph.ainvoke(resume_command("approve"), config)  # the reviewer approves both refunds
        notes["approve"] = "ran"
    except Exception as exc:  # noqa: BLE001 (what the reviewer meets is the observation)
        notes["approve"] = f"raised {type(exc).__name__}"
    effects, broken = await check_retention_race(h, thread, ids[0], 2)
    return effects, lost + [v for v in broken if v.kind != "approval_lost"]


async def run_durable_fault(h, name: str, setting: str = "full", *, saga: SagaDefinition | None = None) -> DurableRun:
    """Run fault ``name`` once on harness ``h`` under ``setting`` (``"full"``, or the fault's weaker setting
    by its name or as ``"weaker"``) and check what it left.

    Args:
        saga: the payout-shaped saga a saga fault runs (the demos' ``store_credit_payout(notice_model())``).

    Raises:
        ValueError: an unknown fault or setting, or a saga fault without ``saga`` or without a pivot step.
    """
    fault = get_durable_fault(name)
    if setting not in ("full", "weaker", fault.weaker):
        raise ValueError(f"unknown setting {setting!r} for fault {name!r}; choose 'full' or {fault.weaker!r}")
    weaker = setting != "full"
    notes: dict = {}
    if fault.needs_saga and saga is None:
        raise ValueError(f"fault {name!r} runs a saga: pass saga=store_credit_payout(notice_model())")
    if name == "lock_holder_killed":
        run_id, cid, email = await _lock_holder_killed(h, saga, weaker, notes)
        effects, violations = await check_payout_run(h, run_id, cid, OPENING_CENTS, email)
    elif name == "abort_after_pivot":
        run_id, cid, email = await _abort_after_pivot(h, saga, weaker, notes)
        effects, violations = await check_payout_run(h, run_id, cid, OPENING_CENTS, email)
    else:
        effects, violations = await _retention_races_thread(h, weaker, notes)
    return DurableRun(name, fault.weaker if weaker else "full", effects, violations, notes)


async def durable_fault_table(h, *, saga: SagaDefinition, faults: tuple[str, ...] | None = None):
    """Every fault (or those named) under ``full`` and under its weaker setting: one row each, with the
    violation counts by kind (a pandas DataFrame indexed by fault and setting)."""
    import pandas as pd

    rows = []
    for name in faults or tuple(DURABLE_FAULTS):
        for setting in ("full", DURABLE_FAULTS[name].weaker):
            run = await run_durable_fault(h, name, setting, saga=saga)
            rows.append({"fault": name, "setting": run.setting, **run.counts()})
    return pd.DataFrame(rows).set_index(["fault", "setting"])
