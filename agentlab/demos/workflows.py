"""``python -m agentlab demo --scenario saga | approval``: the stories beyond one transaction.

``saga``: the store-credit payout saga (:mod:`agentlab.demos.payout_saga`) three times, one per
recovery, each for its own customer: forward recovery (a busy row, step 4 retried alone), backward
recovery (the reference was refunded already: steps 3, 2, 1 compensated, the notice corrected) and
escalation (giving the credit back fails too: the run is parked with one "compensation needed"
row). Then the outbox worker sends the notices, the corrections and the one refund.

``approval``: two refunds above the approval threshold in one batch; the graph stops on one
approval request listing both; three days later (the provider's clock moved, its idempotency keys
forgotten) the reviewer rejects the first and approves the second; the run ends; the worker pays
the approved refund once.

The reports are JSON-ready dicts read back from the database, the provider and the notifier.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from langchain_core.messages import HumanMessage

from agentlab.core.graph import run_config
from agentlab.core.outbox import outbox_counts
from agentlab.core.safeguards import preset
from agentlab.demos.catalog import WORKFLOW_DEMOS
from agentlab.demos.payout_saga import (
    backward_recovery,
    escalation,
    forward_recovery,
    notice_model,
    store_credit_payout,
)
from agentlab.demos.report import kept_lines, render_episode
from agentlab.demos.report import report as episode_report
from agentlab.domains.billing.scenarios import CustomerSpec, create_customers
from agentlab.durable.approval import APPROVAL, ApprovalPolicy
from agentlab.durable.approval_answers import APPROVE, REJECT
from agentlab.durable.approval_review import interrupts_of, resume_command
from agentlab.durable.saga import Backoff
from agentlab.runtime.harness import Episode, Harness
from agentlab.sim.model import ScriptedChatModel

DAYS_LATER = 3
SAGA_OPENING_CREDIT_CENTS = 5000
SAGA_AMOUNT_CENTS = 3000

PROVIDER_COUNTS = "SELECT kind, count(*) FROM provider.payments GROUP BY kind"
NOTIFY_COUNTS = """
SELECT count(*) FILTER (WHERE corrects IS NULL), count(*) FILTER (WHERE corrects IS NOT NULL) FROM notify.messages
"""
MODEL_CALLS = "SELECT count(*) FROM saga_log WHERE step = 'write_notice' AND action = 'started'"
CREDIT_OF = "SELECT credit_cents FROM customers WHERE id = %s"


async def run_workflow_demo(scenario: str, preset_name: str = "full", *, seed: int = 0,
                            keep: bool = False) -> dict[str, Any]:
    """Run the ``saga`` or ``approval`` demo in a fresh database; return its report."""
    if scenario == "saga":
        return await run_saga_demo(seed=seed, keep=keep)
    if scenario == "approval":
        return await run_approval_demo(preset_name, seed=seed, keep=keep)
    raise ValueError(f"unknown workflow demo {scenario!r}; choose one of: {', '.join(WORKFLOW_DEMOS)}")


async def _provider_counts(h: Harness) -> dict[str, int]:
    async with h.pool.connection() as conn:
        rows = await (await conn.execute(PROVIDER_COUNTS)).fetchall()
    counts = {"charge": 0, "refund": 0}
    counts.update({k: n for k, n in rows})
    return counts


async def run_saga_demo(*, seed: int = 0, keep: bool = False) -> dict[str, Any]:
    """The three recoveries of the payout saga; the report holds each run's final state."""
    t0 = time.perf_counter()
    h = await Harness.open(purpose="demo", keep=keep)
    try:
        model = notice_model(seed)
        saga = store_credit_payout(model)
        kwargs = {"lock_timeout_ms": 100, "retry": Backoff(max_attempts=4, initial_s=0.05),
                  "compensation_retry": Backoff(max_attempts=2, initial_s=0.05)}
        async with h.pool.connection() as conn:
            specs = [CustomerSpec("acme", f"Payout customer {i + 1}", SAGA_OPENING_CREDIT_CENTS) for i in range(3)]
            ids = await create_customers(conn, specs, "public")
        stories = (("forward recovery", forward_recovery, "SC-1001"),
                   ("backward recovery", backward_recovery, "SC-1002"),
                   ("escalation", escalation, "SC-1003"))
        runs = []
        for (story, play, reference), customer_id in zip(stories, ids):
            rep = await play(h, saga, customer_id, SAGA_AMOUNT_CENTS, reference, **kwargs)
            runs.append({"story": story, "customer_id": customer_id, **rep.as_dict()})
        drain = await h.worker.drain()
        async with h.pool.connection() as conn:
            for run in runs:
                final = (await (await conn.execute(CREDIT_OF, (run["customer_id"],))).fetchone())[0]
                run["credit_cents"] = {"opening": SAGA_OPENING_CREDIT_CENTS, "final": final}
            notices, corrections = await (await conn.execute(NOTIFY_COUNTS)).fetchone()
            model_calls = (await (await conn.execute(MODEL_CALLS)).fetchone())[0]
        payments = await _provider_counts(h)
        outbox = await outbox_counts(h.pool)
        database = h.url if keep else None
    finally:
        await h.close()
    return {
        "scenario": "saga",
        "runs": runs,
        "steps_done": sum(s["status"] != "pending" and s["status"] != "failed" for r in runs for s in r["steps"]),
        "compensations_run": sum(len(r["compensations"]) for r in runs),
        "escalations": sum(len(r["compensation_needed"]) for r in runs),
        "model_calls": model_calls,
        "notifications": {"sent": notices, "corrections": corrections},
        "charges": payments["charge"],
        "refunds": payments["refund"],
        "outbox": outbox,
        "drain": vars(drain),
        "error": None,
        "wall_s": round(time.perf_counter() - t0, 3),
        "database": database,
    }


def render_saga(rep: dict) -> str:
    """The human-readable account of the saga demo."""
    lines = ["agentlab demo: scenario 'saga' (store credit paid back to the card, in four steps)", ""]
    for run in rep["runs"]:
        lines.append(f"{run['story']}: run {run['run_id']} ended {run['status'].upper()}")
        for s in run["steps"]:
            lines.append(f"    {s['position']}. {s['name']:<16} {s['status']:<20} attempts {s['attempts']}")
        if run["compensations"]:
            lines.append(f"    compensations ran for steps {', '.join(map(str, run['compensations']))} (in that order)")
        if run["parked_reason"]:
            lines.append(f"    parked: {run['parked_reason']}")
        for c in run["compensation_needed"]:
            lines.append(f"    compensation needed: step {c['position']} ({c['step']}), open for a person")
        credit = run["credit_cents"]
        lines.append(f"    store credit {credit['opening']} -> {credit['final']} cents")
        lines.append("")
    n = rep["notifications"]
    lines += [
        "Final state (read from the database, the provider and the notifier):",
        f"  steps done           {rep['steps_done']}",
        f"  compensations run    {rep['compensations_run']}",
        f"  escalations          {rep['escalations']}",
        f"  model calls          {rep['model_calls']} (one per run: never repeated by a retry)",
        f"  messages sent        {n['sent']} notices, {n['corrections']} corrections",
        f"  provider charges     {rep['charges']}",
        f"  provider refunds     {rep['refunds']}",
        f"  wall time            {rep['wall_s']:.2f} s",
    ]
    lines += kept_lines(rep.get("database"), label_width=21)
    return "\n".join(lines)


async def run_approval_demo(preset_name: str = "full", *, seed: int = 0, keep: bool = False,
                            days_later: int = DAYS_LATER) -> dict[str, Any]:
    """The approval story: one request for two refunds, answered ``days_later`` days later."""
    t0 = time.perf_counter()
    sg = preset(preset_name)
    h = await Harness.open(purpose="demo", keep=keep)
    try:
        ids = await h.create_customers(APPROVAL, sg)
        model = ScriptedChatModel(script=APPROVAL.script(ids), seed=seed)
        graph = h.graph(sg, model, approval=ApprovalPolicy())
        thread_id = f"approval-{uuid.uuid4().hex[:12]}"
        config = run_config(thread_id, tenant_id=APPROVAL.tenant_id)
        first = await graph.ainvoke({"messages": [HumanMessage(APPROVAL.prompt)]}, config)
        requests = interrupts_of(first)
        h.provider.clock.advance(days_later * 86400)  # the reviewer answers days later
        calls = requests[0]["calls"] if requests else []
        decisions = {c["tool_call_id"]: (REJECT if i == 0 else APPROVE) for i, c in enumerate(calls)}
        state = await graph.ainvoke(resume_command(decisions), config) if requests else first
        ep = Episode(APPROVAL.name, sg.name, thread_id, seed, ids, sg.schema, APPROVAL.tenant_id,
                     messages=list(state.get("messages", [])), rollbacks_total=state.get("rollbacks_total", 0),
                     escalated=bool(state.get("escalated", False)))
        ep.drain = await h.worker.drain()
        await h.events.flush()
        end = await h.end_state(ep, [c.credit_cents for c in APPROVAL.customers])
        outbox = await outbox_counts(h.pool)
        database = h.url if keep else None
    finally:
        await h.close()
    rep = episode_report(ep, end, outbox, wall_s=time.perf_counter() - t0, database=database)
    rep["approval"] = {
        "requests": len(requests),
        "calls_in_request": [{"tool": c["tool"], "reference": c["args"].get("reference"),
                              "amount_cents": c["amount_cents"]} for c in calls],
        "decisions": [decisions[c["tool_call_id"]] for c in calls],
        "days_later": days_later,
        "threshold_cents": requests[0]["threshold_cents"] if requests else None,
    }
    rep["charges"] = rep["provider_charges"]
    return rep


def render_approval(rep: dict) -> str:
    """The human-readable account of the approval demo."""
    a = rep["approval"]
    lines = [f"Approval: {a['requests']} request for {len(a['calls_in_request'])} call(s) above "
             f"{a['threshold_cents']} cents; answered {a['days_later']} days later:"]
    for call, decision in zip(a["calls_in_request"], a["decisions"]):
        lines.append(f"    {call['tool']} {call['reference']} {call['amount_cents']} cents -> {decision}")
    return render_episode(rep, intro=lines)


def render_workflow(rep: dict) -> str:
    return render_saga(rep) if rep["scenario"] == "saga" else render_approval(rep)
