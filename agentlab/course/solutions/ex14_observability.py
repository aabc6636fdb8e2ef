"""Exercises of notebook 14 (observability)."""

from __future__ import annotations

import pandas as pd

from agentlab import run_events


async def tokens_by_super_step(h, thread_id: str) -> pd.DataFrame:
    """Exercise 14.1: one row per model call of the thread, from its ``node`` events."""
    events = await run_events(h, thread_id, kind="node")
    calls = events[(events["node"] == "agent") & events["input_tokens"].notna()]
    frame = calls[["step", "input_tokens", "output_tokens"]].reset_index(drop=True)
    frame["cumulative_input_tokens"] = frame["input_tokens"].cumsum()
    return frame


async def retries(h, thread_id: str) -> pd.DataFrame:
    """Exercise 14.2: nodes that ran more than once in one super-step, from the ``node`` events."""
    events = await run_events(h, thread_id, kind="node")
    rows = []
    for (node, step), runs in events.groupby(["node", "step"], sort=False):
        if len(runs) < 2:
            continue
        failed = runs["error_class"].dropna()
        rows.append({"node": node, "step": int(step), "attempts": len(runs),
                     "outcomes": " → ".join(runs["outcome"]),
                     "error_class": ", ".join(sorted(set(failed))) if len(failed) else ""})
    return pd.DataFrame(rows, columns=["node", "step", "attempts", "outcomes", "error_class"])
