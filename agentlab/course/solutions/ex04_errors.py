"""Exercises of notebook 04 (the error translator)."""

from __future__ import annotations

import re

from agentlab import find_leaks

EVENT_OF_CALL = """
SELECT tool_name, outcome, sqlstate, error_class, detail FROM events
WHERE tool_call_id = %s AND node = 'tools' ORDER BY id DESC LIMIT 1
"""
CONSTRAINT_IN_DETAIL = re.compile(r"\bconstraint_name=(\w+)")


async def leaking_messages(h, preset_name: str) -> dict:
    """Exercise 4.1: play the invoice story under ``preset_name``; count the ToolMessages that leak."""
    episode = await h.run_episode("invoice", preset_name)
    found = [find_leaks(str(m.content)) for m in episode.tool_messages]
    return {
        "tool_messages": len(found),
        "leaking": sum(bool(kinds) for kinds in found),
        "kinds": sorted({kind for kinds in found for kind in kinds}),
    }


async def explain_call(h, tool_call_id: str) -> dict:
    """Exercise 4.2: what the events table keeps about one tool call (its latest event)."""
    await h.events.flush()  # events are written in batches; write what is buffered first
    rows = await h.df(EVENT_OF_CALL, (tool_call_id,))
    if rows.empty:
        return {"tool": None, "outcome": None, "sqlstate": None, "error_class": None, "constraint": None}
    row = rows.iloc[0]
    match = CONSTRAINT_IN_DETAIL.search(row["detail"] or "")
    return {
        "tool": row["tool_name"],
        "outcome": row["outcome"],
        "sqlstate": row["sqlstate"],
        "error_class": row["error_class"],
        "constraint": match.group(1) if match else None,
    }
