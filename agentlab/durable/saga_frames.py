"""Reading saga runs back: the journal, the steps and the "compensation needed" rows as DataFrames,
and a chart of a run's path forward and back.

Everything here reads what :mod:`agentlab.durable.saga` wrote; nothing writes.
"""

from __future__ import annotations

LIST_LOG = """
SELECT l.id, l.run_id, r.run_key, l.position, l.step, l.action, l.attempt, l.error_class, l.detail, l.created_at
FROM saga_log l JOIN saga_runs r ON r.id = l.run_id
WHERE (%(run)s::bigint IS NULL OR l.run_id = %(run)s) ORDER BY l.id
"""
LIST_STEPS = """
SELECT s.run_id, r.run_key, s.position, s.name, s.external, s.status, s.attempts, s.last_error, s.completed_at,
       s.compensated_at
FROM saga_steps s JOIN saga_runs r ON r.id = s.run_id
WHERE (%(run)s::bigint IS NULL OR s.run_id = %(run)s) ORDER BY s.run_id, s.position
"""
LIST_COMPENSATION_NEEDED = """
SELECT c.id, c.run_id, r.run_key, c.position, c.step, c.action, c.reason, c.status, c.created_at, c.resolved_at
FROM compensation_needed c JOIN saga_runs r ON r.id = c.run_id
WHERE (%(status)s::text IS NULL OR c.status = %(status)s) AND (%(run_id)s::bigint IS NULL OR c.run_id = %(run_id)s)
ORDER BY c.id
"""

ACTION_STYLE = {  # journal action -> (marker, colour, label)
    "completed": ("o", "tab:green", "step completed"),
    "failed": ("X", "tab:red", "step failed"),
    "compensated": ("s", "tab:blue", "compensated"),
    "sent_but_unwound": ("D", "tab:purple", "sent but unwound (corrected)"),
    "compensation_failed": ("X", "black", "compensation failed"),
}



async def _frame(pool, query: str, params: dict, columns: list[str]):
    import pandas as pd

    async with pool.connection() as conn:
        rows = await (await conn.execute(query, params)).fetchall()
    frame = pd.DataFrame(rows, columns=columns)
    for column in ("position", "attempt", "attempts"):
        if column in frame:
            frame[column] = frame[column].astype("Int64")
    return frame


async def saga_log_frame(pool, run_id: int | None = None):
    """The journal (every run, or one), oldest first, as a pandas DataFrame."""
    return await _frame(pool, LIST_LOG, {"run": run_id}, ["id", "run_id", "run_key", "position", "step", "action",
                                                         "attempt", "error_class", "detail", "created_at"])


async def saga_steps_frame(pool, run_id: int | None = None):
    """Steps with status and attempts (every run, or one), as a pandas DataFrame."""
    return await _frame(pool, LIST_STEPS, {"run": run_id}, ["run_id", "run_key", "position", "name", "external",
                                                           "status", "attempts", "last_error", "completed_at",
                                                           "compensated_at"])


async def compensation_needed_frame(pool, status: str | None = "open", *, run_id: int | None = None):
    """The "compensation needed" rows for people (``status`` ``"open"``, ``"resolved"`` or None for all),
    of one saga run when ``run_id`` is given (else of every run), oldest first, as a pandas DataFrame."""
    return await _frame(pool, LIST_COMPENSATION_NEEDED, {"status": status, "run_id": run_id},
                        ["id", "run_id", "run_key", "position", "step", "action", "reason", "status", "created_at",
                         "resolved_at"])


def saga_chart(log, *, ax=None, title: str | None = None):
    """A run's path through its steps, from its journal (:func:`saga_log_frame` of one run).

    x: the journal entry's order; y: the step position. Forward steps climb, compensations come
    back down in reverse order; markers show what each entry was. Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    rows = log[log["position"].notna() & log["action"].isin(list(ACTION_STYLE))].reset_index(drop=True)
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 3.2))
    else:
        fig = ax.figure
    ax.plot(rows.index, rows["position"], color="lightgray", zorder=1)
    for action, (marker, color, label) in ACTION_STYLE.items():
        part = rows[rows["action"] == action]
        if not part.empty:
            ax.scatter(part.index, part["position"], marker=marker, color=color, label=label, zorder=2, s=60)
    steps = rows.drop_duplicates("position").sort_values("position")
    ax.set_yticks(list(steps["position"]), [f"{int(p)} {n}" for p, n in zip(steps["position"], steps["step"])])
    ax.set_xlabel("journal entry (order in which the database recorded it)")
    ax.set_ylabel("step")
    ax.set_title(title or "a saga run: forward, then compensations in reverse order")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    fig.tight_layout()
    return fig
