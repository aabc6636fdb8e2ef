"""Retention of checkpoints: keep active threads replayable, prune idle ones, delete old ones.

Checkpoints grow with every super-step and with the message history (a long thread writes tens of
kilobytes per turn). The retention job sorts the threads by their last checkpoint's time:

- **active** (last checkpoint within ``replayable_for_s``): untouched, every checkpoint kept, so
  the thread can still be replayed or forked from any point;
- **idle** (older): ``aprune(strategy="keep_latest")`` keeps each thread's latest checkpoint with
  its pending writes and the blobs it references; the thread can be resumed (an interrupt waiting
  for approval too), no longer replayed;
- **expired** (older than ``delete_after_s`` and not waiting on a person): ``adelete_thread``.
  A thread with a pending interrupt is never deleted: someone still has to answer it.

A thread can come back between the classification and the delete or prune (the user returns; the
run stops on an approval). Each action is therefore guarded on the checkpoint the thread was
classified by (:attr:`RetentionReport.classified`): a thread whose latest checkpoint has changed since,
that waits for approval (a pending ``approval_requests`` row or interrupt), or whose thread lock a
tools batch holds (the tools node's ``pg_advisory_xact_lock``) is left alone
(:attr:`RetentionReport.left_alone`). Deletes run in one transaction that first locks the checkpoint
tables against writes (``SHARE ROW EXCLUSIVE``, for milliseconds), so the check and the delete see
the same rows; a prune re-checks right before the checkpointer's ``aprune``, whose ``keep_latest``
reads one snapshot and keeps the latest checkpoint it sees.

It never deletes from the kit's tables (it reads ``approval_requests``): the ledger
(``tool_executions``) must outlive the checkpoints (it is what stops a resumed or replayed batch
from applying twice), and the outbox holds payments still to be sent. :class:`RetentionReport`
carries their row counts before and after, so a test can check it.

Bytes are measured as the live rows' size (``sum(pg_column_size(row))``) per table and thread, and
as relation sizes (``pg_total_relation_size``, indexes and TOAST included; PostgreSQL only returns
deleted rows' space to the files after ``VACUUM``). "Bytes per super-step" divides a thread's row
bytes by the super-steps it ran (its checkpoints before retention).

Sources: langgraph-checkpoint-postgres 3.2 ``AsyncPostgresSaver.aprune`` / ``adelete_thread``
(docstrings of ``PostgresSaver.prune``); PostgreSQL docs "Database Object Size Functions",
"Routine Vacuuming".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

CHECKPOINT_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")

THREAD_ACTIVITY = """
WITH latest AS (
    SELECT DISTINCT ON (thread_id) thread_id, checkpoint_id, (checkpoint ->> 'ts')::timestamptz AS last_ts
    FROM checkpoints WHERE checkpoint_ns = ''
    ORDER BY thread_id, checkpoint_id DESC
)
SELECT l.thread_id, l.last_ts,
       (SELECT count(*) FROM checkpoints c WHERE c.thread_id = l.thread_id) AS checkpoints,
       EXISTS (SELECT 1 FROM checkpoint_writes w
               WHERE w.thread_id = l.thread_id AND w.checkpoint_ns = '' AND w.checkpoint_id = l.checkpoint_id
                 AND w.channel = '__interrupt__')
       OR EXISTS (SELECT 1 FROM approval_requests a WHERE a.thread_id = l.thread_id AND a.status = 'pending')
           AS waiting,
       coalesce(%(now)s::timestamptz, now()) - l.last_ts AS idle,
       l.checkpoint_id
FROM latest l ORDER BY l.thread_id
"""
# The threads (of those given, with the checkpoint each was classified by) that are still as they were:
# that checkpoint is still the latest, no tools batch holds the thread lock, and (unless waiting is allowed,
# as a prune allows it: keep_latest keeps the interrupt) nothing waits for approval.
STILL_AS_CLASSIFIED = """
SELECT c.thread_id FROM unnest(%(threads)s::text[], %(checkpoints)s::text[]) AS c (thread_id, checkpoint_id)
WHERE (SELECT k.checkpoint_id FROM checkpoints k WHERE k.thread_id = c.thread_id AND k.checkpoint_ns = ''
       ORDER BY k.checkpoint_id DESC LIMIT 1) = c.checkpoint_id
  AND (%(waiting_allowed)s OR NOT EXISTS (
           SELECT 1 FROM checkpoint_writes w
           WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = '' AND w.checkpoint_id = c.checkpoint_id
             AND w.channel = '__interrupt__'))
  AND (%(waiting_allowed)s OR NOT EXISTS (
           SELECT 1 FROM approval_requests a WHERE a.thread_id = c.thread_id AND a.status = 'pending'))
  AND pg_try_advisory_xact_lock(hashtextextended(c.thread_id, 0))
ORDER BY c.thread_id
"""
LOCK_CHECKPOINT_TABLES = "LOCK TABLE checkpoints, checkpoint_writes, checkpoint_blobs IN SHARE ROW EXCLUSIVE MODE"
DELETE_THREADS = (  # what the checkpointer's adelete_thread runs, for many threads in one transaction
    "DELETE FROM checkpoints WHERE thread_id = ANY(%s)",
    "DELETE FROM checkpoint_blobs WHERE thread_id = ANY(%s)",
    "DELETE FROM checkpoint_writes WHERE thread_id = ANY(%s)",
)
DELETE_BATCH = 200  # threads per delete transaction (each holds one advisory lock per thread until it ends)
THREAD_BYTES = """
SELECT thread_id, 'checkpoints' AS tbl, count(*), coalesce(sum(pg_column_size(t.*)), 0)
FROM checkpoints t WHERE thread_id = ANY(%(threads)s) GROUP BY thread_id
UNION ALL
SELECT thread_id, 'checkpoint_blobs', count(*), coalesce(sum(pg_column_size(t.*)), 0)
FROM checkpoint_blobs t WHERE thread_id = ANY(%(threads)s) GROUP BY thread_id
UNION ALL
SELECT thread_id, 'checkpoint_writes', count(*), coalesce(sum(pg_column_size(t.*)), 0)
FROM checkpoint_writes t WHERE thread_id = ANY(%(threads)s) GROUP BY thread_id
"""
RELATION_BYTES = """
SELECT pg_total_relation_size('checkpoints'), pg_total_relation_size('checkpoint_blobs'),
       pg_total_relation_size('checkpoint_writes')
"""
KIT_ROWS = "SELECT (SELECT count(*) FROM tool_executions), (SELECT count(*) FROM outbox)"
KIT_ROWS_OF_THREADS = """
SELECT (SELECT count(*) FROM tool_executions WHERE thread_id = ANY(%(threads)s)),
       (SELECT count(*) FROM outbox WHERE thread_id = ANY(%(threads)s))
"""


@dataclass(frozen=True)
class RetentionPolicy:
    """How long checkpoints stay, in seconds since a thread's last checkpoint.

    Raises:
        ValueError: ``delete_after_s`` is shorter than ``replayable_for_s``.
    """

    replayable_for_s: float = 7 * 86400.0
    delete_after_s: float = 90 * 86400.0

    def __post_init__(self) -> None:
        if self.delete_after_s < self.replayable_for_s:
            raise ValueError("delete_after_s must be at least replayable_for_s")


@dataclass
class RetentionReport:
    """What a retention run did and measured. Bytes are live row bytes unless named ``relation``."""

    kept: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # threads with a pending interrupt (never deleted)
    left_alone: list[str] = field(default_factory=list)  # classified idle or expired, but moved on since
    classified: dict[str, str] = field(default_factory=dict)  # thread -> its latest checkpoint id when classified
    before: object = None  # pandas DataFrame per thread (see :func:`checkpoint_bytes`)
    after: object = None
    relation_bytes_before: int = 0
    relation_bytes_after: int = 0
    ledger_rows: tuple[int, int] = (0, 0)  # before, after
    outbox_rows: tuple[int, int] = (0, 0)

    def bytes_per_super_step(self):
        """Per thread: action, super-steps, checkpoint row bytes before and after, and per super-step."""
        import pandas as pd

        before = self.before.set_index("thread_id") if self.before is not None else pd.DataFrame()
        after = self.after.set_index("thread_id") if self.after is not None else pd.DataFrame()
        rows = []
        for thread in before.index:
            steps = int(before.at[thread, "checkpoints_rows"]) or 1
            b = int(before.at[thread, "total_bytes"])
            a = int(after.at[thread, "total_bytes"]) if thread in after.index else 0
            action = ("deleted" if thread in self.deleted else "pruned" if thread in self.pruned else
                      "left alone" if thread in self.left_alone else "kept")
            rows.append({"thread_id": thread, "action": action, "super_steps": steps, "bytes_before": b,
                         "bytes_after": a, "bytes_per_super_step_before": round(b / steps, 1),
                         "bytes_per_super_step_after": round(a / steps, 1)})
        return pd.DataFrame(rows)

    def summary(self) -> dict:
        """Counts and byte totals, JSON-ready."""
        total_before = int(self.before["total_bytes"].sum()) if self.before is not None else 0
        total_after = int(self.after["total_bytes"].sum()) if self.after is not None else 0
        steps = int(self.before["checkpoints_rows"].sum()) if self.before is not None else 0
        return {
            "kept": len(self.kept), "pruned": len(self.pruned), "deleted": len(self.deleted),
            "waiting": len(self.waiting), "left_alone": len(self.left_alone), "super_steps": steps,
            "row_bytes_before": total_before, "row_bytes_after": total_after,
            "bytes_per_super_step_before": round(total_before / steps, 1) if steps else None,
            "bytes_per_super_step_after": round(total_after / steps, 1) if steps else None,
            "relation_bytes_before": self.relation_bytes_before, "relation_bytes_after": self.relation_bytes_after,
            "ledger_rows": list(self.ledger_rows), "outbox_rows": list(self.outbox_rows),
        }


async def thread_activity(pool, *, now: dt.datetime | None = None):
    """Every thread with checkpoints: last checkpoint time, checkpoints, waiting (on an interrupt or a
    pending approval request), idle time, and the id of its latest checkpoint, as a DataFrame.

    ``now`` (default: the database's ``now()``) lets a notebook or a test look from a later day.
    """
    import pandas as pd

    async with pool.connection() as conn:
        rows = await (await conn.execute(THREAD_ACTIVITY, {"now": now})).fetchall()
    return pd.DataFrame(rows, columns=["thread_id", "last_ts", "checkpoints", "waiting", "idle", "checkpoint_id"])


async def checkpoint_bytes(pool, thread_ids: list[str]):
    """Per thread: rows and live row bytes in each checkpoint table, and their total, as a DataFrame.

    Columns: ``thread_id``, ``<table>_rows``, ``<table>_bytes`` for each of :data:`CHECKPOINT_TABLES`,
    ``total_bytes``. A thread without rows is listed with zeros.
    """
    import pandas as pd

    async with pool.connection() as conn:
        rows = await (await conn.execute(THREAD_BYTES, {"threads": list(thread_ids)})).fetchall()
    table = {t: {f"{name}_{k}": 0 for name in CHECKPOINT_TABLES for k in ("rows", "bytes")} for t in thread_ids}
    for thread, name, count, size in rows:
        table[thread][f"{name}_rows"] = int(count)
        table[thread][f"{name}_bytes"] = int(size)
    frame = pd.DataFrame([{"thread_id": t, **v} for t, v in table.items()])
    if frame.empty:
        return pd.DataFrame(columns=["thread_id", "total_bytes"])
    frame["total_bytes"] = sum(frame[f"{name}_bytes"] for name in CHECKPOINT_TABLES)
    return frame


async def _relation_bytes(pool) -> int:
    async with pool.connection() as conn:
        return int(sum(await (await conn.execute(RELATION_BYTES)).fetchone()))


async def _kit_rows(pool, threads: list[str] | None = None) -> tuple[int, int]:
    """The ledger's and the outbox's rows: every row, or those of ``threads``."""
    async with pool.connection() as conn:
        if threads is None:
            row = await (await conn.execute(KIT_ROWS)).fetchone()
        else:
            row = await (await conn.execute(KIT_ROWS_OF_THREADS, {"threads": list(threads)})).fetchone()
    return int(row[0]), int(row[1])


async def apply_retention(saver, pool, policy: RetentionPolicy = RetentionPolicy(), *,
                          now: dt.datetime | None = None, dry_run: bool = False,
                          plan: RetentionReport | None = None, guarded: bool = True,
                          threads: Iterable[str] | None = None) -> RetentionReport:
    """Run the retention job once; return what it did, with bytes and the kit's row counts around it.

    Args:
        saver: the ``AsyncPostgresSaver`` (the harness's ``h.saver``).
        pool: a pool on the same database (the harness's ``h.pool``), for the guards and measurements.
        policy: the windows.
        now: the time to judge idleness at (default: the database's ``now()``).
        dry_run: classify and measure only.
        plan: a dry run's report to act on instead of classifying again (its ``classified``
            checkpoints guard every action, however long ago it ran).
        guarded: re-check each thread against its classification before acting (default). False is the
            failure lab's weaker setting (case C33): delete and prune exactly what was classified, so a
            thread the user came back to meanwhile loses its checkpoints, a pending approval with them.
        threads: look at these threads only (default: every thread with checkpoints); the report's
            ledger and outbox rows are then theirs. A notebook scopes its job to the threads it made, so
            a re-run's figures are its own.

    Returns:
        The report: ``pruned`` and ``deleted`` list what was done; threads that moved on since they
        were classified are in ``left_alone`` with every checkpoint kept.
    """
    report = RetentionReport()
    if plan is None:
        activity = await thread_activity(pool, now=now)
        if threads is not None:
            scope = set(threads)
            activity = activity[activity["thread_id"].isin(scope)]
        replayable = dt.timedelta(seconds=policy.replayable_for_s)
        expired = dt.timedelta(seconds=policy.delete_after_s)
        for row in activity.itertuples(index=False):
            report.classified[row.thread_id] = row.checkpoint_id
            if row.waiting:
                report.waiting.append(row.thread_id)
            if row.idle <= replayable:
                report.kept.append(row.thread_id)
            elif row.idle > expired and not row.waiting:
                report.deleted.append(row.thread_id)
            else:
                report.pruned.append(row.thread_id)
    else:
        report.kept, report.pruned, report.deleted = list(plan.kept), list(plan.pruned), list(plan.deleted)
        report.waiting, report.classified = list(plan.waiting), dict(plan.classified)
    threads = list(report.classified)
    report.before = await checkpoint_bytes(pool, threads)
    report.relation_bytes_before = await _relation_bytes(pool)
    scoped = None if threads is None else list(threads)
    ledger_before, outbox_before = await _kit_rows(pool, scoped)
    if not dry_run and not guarded:
        if report.pruned:
            await saver.aprune(list(report.pruned), strategy="keep_latest")
        await _delete_unguarded(pool, report.deleted)
    elif not dry_run:
        pruned = [t for t in report.pruned if await _prune_guarded(saver, pool, t, report.classified[t])]
        deleted = await _delete_guarded(pool, report.deleted, report.classified)
        report.left_alone = sorted(set(report.pruned) - set(pruned) | set(report.deleted) - set(deleted))
        report.pruned, report.deleted = pruned, deleted
    report.after = await checkpoint_bytes(pool, threads)
    report.relation_bytes_after = await _relation_bytes(pool)
    ledger_after, outbox_after = await _kit_rows(pool, scoped)
    report.ledger_rows = (ledger_before, ledger_after)
    report.outbox_rows = (outbox_before, outbox_after)
    return report


async def _prune_guarded(saver, pool, thread: str, checkpoint_id: str) -> bool:
    """Prune one thread if it is still as classified (checked right before ``aprune``); True if pruned."""
    async with pool.connection() as conn:
        still = await (await conn.execute(STILL_AS_CLASSIFIED, {"threads": [thread], "checkpoints": [checkpoint_id],
                                                                "waiting_allowed": True})).fetchall()
    if not still:
        return False
    await saver.aprune([thread], strategy="keep_latest")
    return True


async def _delete_guarded(pool, threads: list[str], classified: dict[str, str]) -> list[str]:
    """Delete the threads still as classified, in transactions that lock out checkpoint writes while
    they check and delete; return the threads deleted."""
    deleted: list[str] = []
    for start in range(0, len(threads), DELETE_BATCH):
        batch = threads[start:start + DELETE_BATCH]
        async with pool.connection() as conn, conn.transaction():
            await conn.execute(LOCK_CHECKPOINT_TABLES)
            rows = await (await conn.execute(STILL_AS_CLASSIFIED, {
                "threads": batch, "checkpoints": [classified[t] for t in batch], "waiting_allowed": False})).fetchall()
            still = [r[0] for r in rows]
            if still:
                for statement in DELETE_THREADS:
                    await conn.execute(statement, (still,))
        deleted += still
    return deleted


async def _delete_unguarded(pool, threads: list[str]) -> None:
    """Delete the threads as classified, whatever happened since (the weaker setting, ``guarded=False``)."""
    for start in range(0, len(threads), DELETE_BATCH):
        async with pool.connection() as conn, conn.transaction():
            for statement in DELETE_THREADS:
                await conn.execute(statement, (threads[start:start + DELETE_BATCH],))


def retention_chart(report: RetentionReport, *, ax=None, title: str | None = None,
                    threads: dict[str, str] | None = None):
    """Checkpoint row bytes per super-step, per thread, before and after a retention run (bars).

    ``threads`` maps the thread ids to show to their labels (default: every thread, labelled with its
    number and action: kept, pruned, deleted). Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    frame = report.bytes_per_super_step()
    if threads is not None:
        order = {t: n for n, t in enumerate(threads)}
        frame = frame[frame["thread_id"].isin(list(threads))].sort_values(
            "thread_id", key=lambda col: col.map(order)).reset_index(drop=True)
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 3.2))
    else:
        fig = ax.figure
    xs = range(len(frame))
    ax.bar([x - 0.2 for x in xs], frame["bytes_per_super_step_before"], width=0.4, label="before", color="tab:gray")
    ax.bar([x + 0.2 for x in xs], frame["bytes_per_super_step_after"], width=0.4, label="after", color="tab:green")
    labels = ([threads[t] for t in frame["thread_id"]] if threads is not None
              else [f"thread {i + 1}\n{a}" for i, a in enumerate(frame["action"])])
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("checkpoint row bytes per super-step (B)")
    ax.set_title(title or "checkpoint bytes per super-step, before and after retention")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


async def retention_experiment(h, *, turns: tuple[int, ...] = (1, 20, 60), idle_days: float = 10.0,
                               policy: RetentionPolicy = RetentionPolicy(),
                               threads: Iterable[str] | None = None) -> RetentionReport:
    """Threads of growing length, then one retention run ``idle_days`` later; returns its report.

    Each thread plays the refund story, then ``n - 1`` more user turns (each a super-step of the
    agent), every checkpoint written (durability ``sync``). The report's
    :meth:`RetentionReport.bytes_per_super_step` shows how bytes per super-step grow with the
    history and what ``keep_latest`` leaves. With ``threads``, the job looks at those and the
    experiment's own threads only (see :func:`apply_retention`); without, at every thread.
    """
    from langchain_core.messages import HumanMessage

    from agentlab.core.graph import run_config
    from agentlab.core.safeguards import preset
    from agentlab.domains.billing.scenarios import get_scenario
    from agentlab.sim.model import ScriptedChatModel

    scenario, sg = get_scenario("refund"), preset("full")
    own: list[str] = []
    for n in turns:
        ids = await h.create_customers(scenario, sg)
        graph = h.graph(sg, ScriptedChatModel(script=scenario.script(ids)))
        config = run_config(f"retention-{n}-turns-{ids[0]}", tenant_id=scenario.tenant_id)
        own.append(config["configurable"]["thread_id"])
        await graph.ainvoke({"messages": [HumanMessage(scenario.prompt)]}, config, durability="sync")
        for turn in range(n - 1):
            await graph.ainvoke({"messages": [HumanMessage(f"Thanks. Is anything else open? ({turn + 1})")]},
                                config, durability="sync")
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=idle_days)
    scope = None if threads is None else [*threads, *own]
    return await apply_retention(h.saver, h.pool, policy, now=later, threads=scope)
