"""``python -m agentlab demo``: the seed's stories, end to end, told step by step.

``refund`` (default): in one step the model sends CreateCreditMemo, ApplyCredit and QueueRefund, the
third with the customer id as text with a stray quote. Under ``full`` the batch is refused before any
SQL (one FAILED naming the field, two NOT APPLIED), the model corrects and resends, the batch
commits, the outbox worker refunds once. Under ``naive`` the first two commit, the third fails with
a raw error, the model resends all three: two credit memos and a double deduction.

``invoice``: CreateInvoice, ApplyCredit over the balance (breaks the CHECK), QueueCharge; the batch is
rolled back, the model applies the available credit instead, the batch commits, one charge.
"""

from __future__ import annotations

import json
import time
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from agentlab.harness import Harness
from agentlab.outbox import outbox_counts
from agentlab.safeguards import PRESET_NOTES, preset
from agentlab.scenarios import get_scenario


async def run_demo(scenario: str = "refund", preset_name: str = "full", *, seed: int = 0,
                   keep: bool = False) -> dict[str, Any]:
    """Run one demo episode in a fresh database; return the report (see :func:`report`).
    ``saga`` and ``approval`` run :mod:`agentlab.demo_workflows` instead."""
    if scenario in ("saga", "approval"):
        from agentlab.demo_workflows import run_workflow_demo

        return await run_workflow_demo(scenario, preset_name, seed=seed, keep=keep)
    sc = get_scenario(scenario)
    sg = preset(preset_name)
    t0 = time.perf_counter()
    h = await Harness.open(purpose="demo", keep=keep)
    try:
        ep = await h.run_episode(sc, sg, seed=seed)
        rep = await episode_report(h, ep)
    finally:
        await h.close()
    rep["wall_s"] = round(time.perf_counter() - t0, 3)
    rep["database"] = h.url if keep else None
    return rep


async def episode_report(h: Harness, ep) -> dict[str, Any]:
    """The report of an episode already run on ``h`` (what the demo prints), read from the database."""
    sc = get_scenario(ep.scenario)
    state = await h.end_state(ep, [c.credit_cents for c in sc.customers])
    outbox = await outbox_counts(h.pool)
    return report(ep, state, outbox, wall_s=ep.wall_ms / 1000)


def report(ep, state: dict, outbox: dict, *, wall_s: float, database: str | None = None) -> dict[str, Any]:
    """The demo's JSON: counts from the database and the provider, and the steps from the messages."""
    customers = state["customers"]
    return {
        "scenario": ep.scenario,
        "preset": ep.preset,
        "credit_memos": sum(c["credit_memos"] for c in customers),
        "invoices": sum(c["invoices"] for c in customers),
        "refunds": sum(c["refunds"] for c in customers),
        "balance_cents": {
            str(c["customer_id"]): {"opening": c["opening_credit_cents"], "final": c["final_credit_cents"]}
            for c in customers
        },
        "provider_charges": sum(c["provider_charges"] for c in customers),
        "provider_refunds": sum(c["provider_refunds"] for c in customers),
        "rollbacks": ep.rollbacks_total,
        "escalated": ep.escalated,
        "tool_calls": sum(len(m.tool_calls) for m in ep.messages if isinstance(m, AIMessage)),
        "tool_messages": len(ep.tool_messages),
        "unanswered_tool_calls": len(ep.unanswered),
        "outbox": outbox,
        "steps": steps(ep.messages),
        "error": ep.error,
        "wall_s": round(wall_s, 3),
        "database": database,
    }


def steps(messages: list) -> list[dict]:
    """Each batch the model sent, with each call's outcome and the text the model got back."""
    replies = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    out = []
    for m in messages:
        if not isinstance(m, AIMessage) or not m.tool_calls:
            continue
        calls = []
        for tc in m.tool_calls:
            reply = replies.get(tc["id"])
            artifact = getattr(reply, "artifact", None) or {}
            calls.append({"tool": tc["name"], "args": tc["args"],
                          "outcome": artifact.get("outcome", "unanswered" if reply is None else "unknown"),
                          "reply": str(reply.content) if reply is not None else None})
        out.append({"calls": calls})
    return out


def render(rep: dict, *, timing: bool = True) -> str:
    """The human-readable account of a demo report (``timing=False`` leaves out the wall time)."""
    if "runs" in rep or "approval" in rep:  # the saga and approval demos (agentlab.demo_workflows)
        from agentlab.demo_workflows import render_workflow

        return render_workflow(rep)
    return render_episode(rep, timing=timing)


def render_episode(rep: dict, *, timing: bool = True) -> str:
    """The human-readable account of one episode's report."""
    lines = [f"agentlab demo: scenario '{rep['scenario']}', preset '{rep['preset']}'",
             f"  {PRESET_NOTES.get(rep['preset'], '')}", ""]
    for n, step in enumerate(rep["steps"], 1):
        lines.append(f"Step {n}: the model sends {len(step['calls'])} tool call(s) in one message")
        for c in step["calls"]:
            args = ", ".join(f"{k}={v!r}" for k, v in c["args"].items()) if isinstance(c["args"], dict) else c["args"]
            lines.append(f"    {c['tool']}({args})")
        for c in step["calls"]:
            lines.append(f"  -> {c['tool']:<17} {c['outcome'].upper():<11} {_short(c['reply'])}")
        outcomes = {c["outcome"] for c in step["calls"]}
        if outcomes & {"failed", "not_applied"} and not outcomes & {"applied"}:
            lines.append("     batch rolled back: nothing of it is in the database")
        lines.append("")
    if rep["error"]:
        lines.append(f"The run stopped on an error: {rep['error']}")
    if rep["escalated"]:
        lines.append("The run was escalated to a human after repeated rollbacks.")
    ob = rep["outbox"]
    lines.append(f"Outbox: {ob['dispatched']} dispatched, {ob['pending']} pending, {ob['dead_letter']} dead letter")
    lines.append("")
    lines.append("Final state (read from the database and the provider):")
    lines.append(f"  credit memos      {rep['credit_memos']}")
    lines.append(f"  invoices          {rep['invoices']}")
    for cid, b in rep["balance_cents"].items():
        lines.append(f"  credit balance    customer {cid}: {b['opening']} -> {b['final']} cents")
    lines.append(f"  provider charges  {rep['provider_charges']}")
    lines.append(f"  provider refunds  {rep['provider_refunds']}")
    lines.append(f"  rollbacks         {rep['rollbacks']}")
    lines.append(f"  tool messages     {rep['tool_messages']} for {rep['tool_calls']} tool calls "
                 f"({rep['unanswered_tool_calls']} unanswered)")
    if timing:
        lines.append(f"  wall time         {rep['wall_s']:.2f} s")
    if rep.get("database"):
        lines.append(f"  database kept     {rep['database']}")
    return "\n".join(lines)


def _short(text: str | None, width: int = 110) -> str:
    if text is None:
        return "(no answer)"
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def to_json(rep: dict) -> str:
    return json.dumps(rep, default=str)
