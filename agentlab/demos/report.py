"""A demo episode's report: counts read from the database and the provider, and its rendering as text."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage

from agentlab.core.messages import steps
from agentlab.core.outbox import outbox_counts
from agentlab.core.safeguards import PRESET_NOTES
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.runtime.harness import Harness


async def episode_report(h: Harness, ep) -> dict[str, Any]:
    """The report of an episode already run on ``h`` (what the demo prints), read from the database: the
    outbox rows are the episode's own (an episode run again beside it counts its own)."""
    sc = get_scenario(ep.scenario)
    state = await h.end_state(ep, [c.credit_cents for c in sc.customers])
    outbox = await outbox_counts(h.pool, ep.thread_id)
    return report(ep, state, outbox, wall_s=ep.wall_ms / 1000)


def report(ep, state: dict, outbox: dict, *, wall_s: float, database: str | None = None) -> dict[str, Any]:
    """The demo's JSON: counts from the database and the provider, and the steps from the messages."""
    customers = state["customers"]
    return _episode_fields(ep, outbox, wall_s, database, {
        "credit_memos": sum(c["credit_memos"] for c in customers),
        "invoices": sum(c["invoices"] for c in customers),
        "refunds": sum(c["refunds"] for c in customers),
        "balance_cents": {
            str(c["customer_id"]): {"opening": c["opening_credit_cents"], "final": c["final_credit_cents"]}
            for c in customers
        },
        "provider_charges": sum(c["provider_charges"] for c in customers),
        "provider_refunds": sum(c["provider_refunds"] for c in customers),
    })


def domain_report(ep, domain: str, violations: list, outbox: dict, *, wall_s: float,
                  database: str | None = None) -> dict[str, Any]:
    """The JSON of a demo on a domain other than billing: the steps, the outbox, and each violation of the
    generic invariants and the domain's own (``kind`` and ``detail``; an empty list when all hold)."""
    return _episode_fields(ep, outbox, wall_s, database, {
        "domain": domain, "violations": [{"kind": v.kind, "detail": v.detail} for v in violations]})


def _episode_fields(ep, outbox: dict, wall_s: float, database: str | None, state: dict) -> dict[str, Any]:
    return {
        "scenario": ep.scenario,
        "preset": ep.preset,
        **state,
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


def render_episode(rep: dict, *, timing: bool = True, intro: list[str] | tuple[str, ...] = ()) -> str:
    """The human-readable account of one episode's report; ``intro`` lines (a workflow demo's own
    block) come right under the header."""
    lines = [f"agentlab demo: scenario '{rep['scenario']}', preset '{rep['preset']}'",
             f"  {PRESET_NOTES.get(rep['preset'], '')}", ""]
    if intro:
        lines += [*intro, ""]
    lines += _story_lines(rep)
    lines.append("Final state (read from the database and the provider):")
    lines.append(f"  credit memos      {rep['credit_memos']}")
    lines.append(f"  invoices          {rep['invoices']}")
    for cid, b in rep["balance_cents"].items():
        lines.append(f"  credit balance    customer {cid}: {b['opening']} -> {b['final']} cents")
    lines.append(f"  provider charges  {rep['provider_charges']}")
    lines.append(f"  provider refunds  {rep['provider_refunds']}")
    lines += _closing_lines(rep, timing)
    return "\n".join(lines)


def render_domain_episode(rep: dict, *, timing: bool = True) -> str:
    """The human-readable account of a :func:`domain_report`."""
    lines = [f"agentlab demo: domain '{rep['domain']}', scenario '{rep['scenario']}', preset '{rep['preset']}'",
             f"  {PRESET_NOTES.get(rep['preset'], '')}", ""]
    lines += _story_lines(rep)
    if rep["violations"]:
        lines.append(f"Invariants (read from the database and the provider): {len(rep['violations'])} violation(s)")
        lines += [f"  {v['kind']:<17} {shorten(v['detail'])}" for v in rep["violations"]]
    else:
        lines.append("Invariants (read from the database and the provider): all hold")
    lines += ["", "The run:"]
    lines += _closing_lines(rep, timing)
    return "\n".join(lines)


def _closing_lines(rep: dict, timing: bool) -> list[str]:
    lines = [f"  rollbacks         {rep['rollbacks']}",
             (f"  tool messages     {rep['tool_messages']} for {rep['tool_calls']} tool calls "
              f"({rep['unanswered_tool_calls']} unanswered)")]
    if timing:
        lines.append(f"  wall time         {rep['wall_s']:.2f} s")
    return lines + kept_lines(rep.get("database"), label_width=18)




def _story_lines(rep: dict) -> list[str]:
    """The steps (each call, its outcome and its answer), an error or escalation, and the outbox line."""
    lines: list[str] = []
    for n, step in enumerate(rep["steps"], 1):
        lines.append(f"Step {n}: the model sends {len(step['calls'])} tool call(s) in one message")
        for c in step["calls"]:
            args = ", ".join(f"{k}={v!r}" for k, v in c["args"].items()) if isinstance(c["args"], dict) else c["args"]
            lines.append(f"    {c['tool']}({args})")
        for c in step["calls"]:
            lines.append(f"  -> {c['tool']:<17} {c['outcome'].upper():<11} {shorten(c['reply'])}")
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
    return lines


SHORTENED_MARK = " [...]"


def kept_lines(database: str | None, *, label_width: int) -> list[str]:
    """The lines naming a database the demo kept (``--keep``) and the exact command to look at it;
    the name only, never the URL (it may hold a password)."""
    if not database:
        return []
    from agentlab.runtime.db import dbname_of

    name = dbname_of(database)
    return [f"  {'database kept':<{label_width}}{name} (until `python -m agentlab db clean`)",
            f"  {'look at it with':<{label_width}}psql \"$(python -m agentlab db url {name})\""]


def shorten(text: str | None, width: int = 110) -> str:
    """``text`` on one line, at most ``width`` characters: cut at the last word boundary that fits,
    with :data:`SHORTENED_MARK` saying so; ``"(no answer)"`` for None."""
    if text is None:
        return "(no answer)"
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    room = width - len(SHORTENED_MARK)
    cut = text[:room + 1].rsplit(" ", 1)[0] if " " in text[:room + 1] else ""
    if len(cut) < room // 2:  # one very long word (a JSON blob): cut inside it rather than drop it
        cut = text[:room]
    return cut.rstrip(" ,;:") + SHORTENED_MARK




def to_json(rep: dict) -> str:
    return json.dumps(rep, default=str)
