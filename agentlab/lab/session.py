"""The failure lab as plain calls: one episode under a fault, shown as DataFrames, and charts that refresh.

Pick a scenario, a preset and a fault; run one seeded episode (:meth:`agentlab.lab.runner.Lab.run`: the fault
injected by a real mechanism, the outbox drained, the invariants checked); read back what happened::

    session = LabSession(h)
    result = await session.run(scenario="refund", preset="savepoints", fault="crash_before_checkpoint", seed=0)
    result.tool_messages    # every tool call, its outcome, the text the model read
    result.rollbacks        # one row per batch: outcomes counted, rolled back or not
    result.ledger           # the thread's rows of the idempotency ledger (tool_executions)
    result.ledger_counts    # per tool: calls applied (ledger rows) and replayed (answered from the ledger)
    result.outbox           # the thread's outbox rows
    result.rows             # the affected customers: balance, records, payments at the provider
    result.violations       # what the invariant checker found
    session.history()       # one row per episode of the session
    rollback_rate_chart(session.history()); ledger_chart(result.ledger_counts)

:func:`lab_run` is the same episode without a session. The widget (:class:`agentlab.lab.widget.FailureLab`)
is a thin layer over :meth:`LabSession.run` and the charts here, so an episode run by the widget and
the same call made by hand leave the same database state. Everything shown is read back from the
database and the provider (ledger, outbox, events, business rows) or from the message history, never
from the code's own bookkeeping; the events table supplies the replays (the node logs each one).

Sources: LangGraph docs "Persistence"; PostgreSQL docs "SAVEPOINT"; the kit's :mod:`agentlab.lab.invariants`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, ToolMessage

from agentlab.core.safeguards import Safeguards, preset
from agentlab.lab.charts import ledger_chart, rollback_rate_chart, rollback_rates  # noqa: F401 (re-exported)
from agentlab.lab.faults import fault_scenarios, get_fault
from agentlab.lab.runner import FaultRun, Lab

if TYPE_CHECKING:
    import pandas as pd

    from agentlab.runtime.harness import Harness

TOOL_MESSAGE_COLUMNS = ("batch", "tool", "args", "outcome", "message")
ROLLBACK_COLUMNS = ("batch", "calls", "applied", "replayed", "failed", "not_applied", "rolled_back")
LEDGER_COLUMNS = ("tool", "tool_call_id", "attempt", "result")
LEDGER_COUNT_COLUMNS = ("tool", "applied", "replayed")
OUTBOX_COLUMNS = ("topic", "dedupe_key", "status", "attempts")
HISTORY_COLUMNS = ("episode", "fault", "preset", "scenario", "seed", "batches", "rollbacks", "escalated", "crashed",
                   "violations")
OUTCOMES = ("applied", "replayed", "failed", "not_applied")

LEDGER_ROWS = """
SELECT tool_name AS tool, tool_call_id, attempt, result::text AS result
FROM tool_executions WHERE thread_id = %s ORDER BY tool_call_id
"""
# per tool of the thread: ledger rows (calls applied under the ledger) and replays (the node's events)
LEDGER_COUNTS = """
SELECT t.tool,
       (SELECT count(*) FROM tool_executions x WHERE x.thread_id = %(t)s AND x.tool_name = t.tool) AS applied,
       (SELECT count(*) FROM events e WHERE e.thread_id = %(t)s AND e.tool_name = t.tool
          AND e.outcome = 'replayed') AS replayed
FROM (SELECT tool_name AS tool FROM tool_executions WHERE thread_id = %(t)s
      UNION SELECT tool_name FROM events WHERE thread_id = %(t)s AND outcome = 'replayed') t
ORDER BY t.tool
"""
# the node's call events and its "COMMIT turned into ROLLBACK" notes, in the order it recorded them
CALL_EVENTS = """
SELECT tool_call_id, outcome FROM events
WHERE thread_id = %s AND (kind = 'call' OR outcome = 'commit_rolled_back') ORDER BY id
"""
OUTBOX_ROWS = "SELECT topic, dedupe_key, status, attempts FROM outbox WHERE thread_id = %s ORDER BY id"


@dataclass(repr=False)
class LabResult:
    """One episode of the failure lab, read back as DataFrames.

    Attributes:
        fault, preset, scenario, seed: what was run (``preset`` is the preset's name; ``custom`` for a
            hand-made :class:`agentlab.core.safeguards.Safeguards`).
        run: the checked episode (:class:`agentlab.lab.runner.FaultRun`: messages, notes of the fault, violations).
        tool_messages: one row per tool call (:data:`TOOL_MESSAGE_COLUMNS`), batches numbered from 1.
        rollbacks: one row per batch (:data:`ROLLBACK_COLUMNS`); ``rolled_back`` when nothing of it was applied.
        ledger: the thread's ledger rows (:data:`LEDGER_COLUMNS`); empty when the preset has no ledger.
        ledger_counts: per tool, ``applied`` (ledger rows) and ``replayed`` (calls answered from the ledger).
        outbox: the thread's outbox rows (:data:`OUTBOX_COLUMNS`); empty when the provider is called inline.
        rows: the episode's customers: balance, invoices, credit memos, refunds, charges and refunds at the
            provider.
        violations: one row per invariant violation (``kind``, ``detail``).
    """

    fault: str
    preset: str
    scenario: str
    seed: int
    run: FaultRun
    tool_messages: pd.DataFrame
    rollbacks: pd.DataFrame
    ledger: pd.DataFrame
    ledger_counts: pd.DataFrame
    outbox: pd.DataFrame
    rows: pd.DataFrame
    violations: pd.DataFrame

    def __repr__(self) -> str:
        return f"LabResult({self.headline()})"

    @property
    def thread_id(self) -> str:
        return self.run.episode.thread_id

    @property
    def batches(self) -> int:
        return len(self.rollbacks)

    @property
    def rolled_back(self) -> int:
        """Batches of which nothing was applied."""
        return int(self.rollbacks["rolled_back"].sum()) if len(self.rollbacks) else 0

    @property
    def ok(self) -> bool:
        return not len(self.violations)

    def summary(self) -> dict[str, Any]:
        """One line of the session's history (:data:`HISTORY_COLUMNS` without ``episode``)."""
        ep = self.run.episode
        return {"fault": self.fault, "preset": self.preset, "scenario": self.scenario, "seed": self.seed,
                "batches": self.batches, "rollbacks": self.rolled_back, "escalated": ep.escalated,
                "crashed": self.run.crashed or self.run.worker_crashed, "violations": len(self.violations)}

    def headline(self) -> str:
        """One sentence: the episode and what the checker found."""
        s = self.summary()
        kinds = sorted(set(self.violations["kind"])) if len(self.violations) else []
        found = f"{s['violations']} violation(s): {', '.join(kinds)}" if kinds else "0 violations"
        extra = "".join([", escalated" if s["escalated"] else "", ", crashed and resumed" if s["crashed"] else ""])
        return (f"{self.fault} under {self.preset} ({self.scenario}, seed {self.seed}): {s['batches']} batch(es), "
                f"{s['rollbacks']} rolled back{extra}; {found}")

    def tables(self) -> dict[str, pd.DataFrame]:
        """The result's tables by title, in the order the widget shows them."""
        return {"tool messages": self.tool_messages, "rollbacks": self.rollbacks, "ledger": self.ledger,
                "outbox": self.outbox, "affected rows": self.rows, "violations": self.violations}


def _outcome(message: ToolMessage | None) -> str:
    if message is None:
        return "unanswered"
    return (getattr(message, "artifact", None) or {}).get("outcome", "unknown")


def message_frames(messages: list, commit_rolled_back: set[str] = frozenset()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tool messages (one row per call) and the rollbacks (one row per batch) of an episode's ``messages``.

    A batch is ``rolled_back`` when the model was told nothing of it was applied, or when one of its call
    ids is in ``commit_rolled_back``: calls of a batch whose COMMIT PostgreSQL turned into ROLLBACK after
    they were reported applied (the aborted-transaction trap without savepoints, case C09; see
    :func:`commit_rolled_back_calls`).
    """
    import pandas as pd

    replies = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    calls, batches = [], []
    for m in messages:
        if not isinstance(m, AIMessage) or not m.tool_calls:
            continue
        n = len(batches) + 1
        outcomes = []
        for tc in m.tool_calls:
            reply = replies.get(tc["id"])
            outcomes.append(_outcome(reply))
            calls.append((n, tc["name"], json.dumps(tc["args"], default=str), outcomes[-1],
                          str(reply.content) if reply is not None else ""))
        counts = {o: outcomes.count(o) for o in OUTCOMES}
        told_nothing = counts["applied"] + counts["replayed"] == 0 and counts["failed"] + counts["not_applied"] > 0
        rolled_back = told_nothing or any(tc["id"] in commit_rolled_back for tc in m.tool_calls)
        batches.append((n, len(outcomes), *counts.values(), rolled_back))
    return (pd.DataFrame(calls, columns=list(TOOL_MESSAGE_COLUMNS)),
            pd.DataFrame(batches, columns=list(ROLLBACK_COLUMNS)))


def commit_rolled_back_calls(events: pd.DataFrame, messages: list) -> set[str]:
    """The tool call ids of the batches whose COMMIT PostgreSQL turned into ROLLBACK, from the thread's
    ``events`` (:data:`CALL_EVENTS`, in the order recorded): the node records that note right before the
    call events of the same batch, so the call after a note names the batch (all its ids are returned)."""
    batches = [[tc["id"] for tc in m.tool_calls] for m in messages if isinstance(m, AIMessage) and m.tool_calls]
    batch_of = {call_id: ids for ids in batches for call_id in ids}
    out: set[str] = set()
    after_note = False
    for call_id, outcome in events[["tool_call_id", "outcome"]].itertuples(index=False):
        if outcome == "commit_rolled_back":
            after_note = True
        elif after_note and isinstance(call_id, str):
            out.update(batch_of.get(call_id, [call_id]))
            after_note = False
    return out


async def read_result(h: Harness, run: FaultRun, seed: int) -> LabResult:
    """The :class:`LabResult` of a checked episode ``run`` on ``h``'s database (events flushed first)."""
    import pandas as pd

    await h.events.flush()
    ep = run.episode
    events = await h.df(CALL_EVENTS, (ep.thread_id,))
    tool_messages, rollbacks = message_frames(ep.messages, commit_rolled_back_calls(events, ep.messages))
    rows = await affected_rows(h, ep)
    violations = pd.DataFrame([(v.kind, v.detail) for v in run.violations], columns=["kind", "detail"])
    ledger = await h.df(LEDGER_ROWS, (ep.thread_id,))
    sent = {tc["id"]: n for n, tc in enumerate(tc for m in ep.messages if isinstance(m, AIMessage)
                                                for tc in m.tool_calls)}
    ledger = ledger.sort_values("tool_call_id", key=lambda ids: ids.map(lambda i: sent.get(i, len(sent))),
                                kind="stable").reset_index(drop=True)  # in the order the model sent the calls
    return LabResult(
        fault=run.fault, preset=run.preset, scenario=run.scenario.name, seed=seed, run=run,
        tool_messages=tool_messages, rollbacks=rollbacks, ledger=ledger,
        ledger_counts=await h.df(LEDGER_COUNTS, {"t": ep.thread_id}),
        outbox=await h.df(OUTBOX_ROWS, (ep.thread_id,)), rows=rows, violations=violations,
    )


async def affected_rows(h: Harness, ep) -> pd.DataFrame:
    """What the database and the provider hold for the episode's own rows, as its domain shows them: its
    ``episode_rows`` (billing: its customers with their records and payments), else its ``export_state`` (one
    row per key), else the rows' ids."""
    import pandas as pd

    domain, ids = h.domain, list(ep.customer_ids)
    if domain.episode_rows is None and domain.export_state is None:
        return pd.DataFrame({"id": ids})
    async with h.pool.connection() as conn:
        if domain.episode_rows is not None:
            return pd.DataFrame(await domain.episode_rows(conn, ids, ep.schema))
        state = await domain.export_state(conn, ids)
    return pd.json_normalize(state) if isinstance(state, list) else pd.json_normalize([state])


def check_choice(fault: str, scenario: str | None, domain=None) -> None:
    """Raise ValueError when ``fault`` is unknown or does not fit ``scenario`` of ``domain`` (default
    billing; a fault acts on the calls or rows of the scenarios it lists)."""
    f = get_fault(fault, domain)
    fits = fault_scenarios(f, domain)
    if scenario is not None and scenario not in fits:
        raise ValueError(f"fault {fault!r} fits the scenarios {', '.join(fits)}, not {scenario!r}")


async def lab_run(h: Harness, *, scenario: str | None = None, preset: str | Safeguards = "full",
                  fault: str = "none", seed: int = 0, lab: Lab | None = None) -> LabResult:
    """Run one seeded episode of ``scenario`` under ``preset`` with ``fault`` injected on ``h``'s database,
    check it and read it back.

    Args:
        scenario: a scenario the fault fits (``agentlab.get_fault(fault).scenarios``); None: the seed picks one.
        preset: a preset name (``naive`` ... ``full``) or a :class:`agentlab.core.safeguards.Safeguards` value.
        fault: a fault name (``agentlab.FAULTS``; ``none`` is the control).
        seed: seeds the scenario choice, the hallucinations and the model's call ids.
        lab: an open :class:`agentlab.lab.runner.Lab` on ``h`` to run in (default: one opened and closed here).

    Raises:
        ValueError: an unknown preset or fault, or a scenario the fault does not fit.
    """
    check_choice(fault, scenario, h.domain)
    sg = _preset(preset)
    if lab is None:
        async with Lab(h) as own:
            run = await own.run(fault, sg, scenario=scenario, seed=seed)
    else:
        run = await lab.run(fault, sg, scenario=scenario, seed=seed)
    return await read_result(h, run, seed)


def _preset(value: str | Safeguards) -> Safeguards:
    return preset(value) if isinstance(value, str) else value


@dataclass
class LabSession:
    """A run of the failure lab on one harness: episodes one after the other, kept for the charts.

    ``await session.run(...)`` runs ``episodes`` episodes (seeds ``seed``, ``seed + 1``, ...) through
    :func:`lab_run`; :attr:`results` keeps every :class:`LabResult`, :meth:`history` sums them up.
    Episodes run one at a time, so the database's ids come out in the same order on every run.
    """

    harness: Harness
    results: list[LabResult] = field(default_factory=list)

    async def run(self, *, scenario: str | None = None, preset: str | Safeguards = "full", fault: str = "none",
                  seed: int = 0, episodes: int = 1) -> LabResult:
        """Run ``episodes`` episodes (see :func:`lab_run`); return the last one's result.

        Raises:
            ValueError: ``episodes`` below 1, or what :func:`lab_run` raises.
            agentlab.runtime.harness.HarnessClosed: :attr:`harness` was closed (at once, nothing run).
        """
        if episodes < 1:
            raise ValueError("episodes must be at least 1")
        check_choice(fault, scenario)
        sg = _preset(preset)
        result = None
        async with Lab(self.harness) as lab:
            for k in range(episodes):
                result = await lab_run(self.harness, scenario=scenario, preset=sg, fault=fault, seed=seed + k,
                                       lab=lab)
                self.results.append(result)
        return result

    @property
    def last(self) -> LabResult | None:
        return self.results[-1] if self.results else None

    def history(self) -> pd.DataFrame:
        """One row per episode run so far (:data:`HISTORY_COLUMNS`), numbered from 1."""
        import pandas as pd

        rows = [{"episode": n, **r.summary()} for n, r in enumerate(self.results, 1)]
        return pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))

    def ledger_counts(self) -> pd.DataFrame:
        """Applied and replayed calls per tool, summed over every episode of the session."""
        return sum_ledger_counts([r.ledger_counts for r in self.results])

    def violations_by_kind(self) -> pd.DataFrame:
        """Invariant violations per kind (columns, counts) for each fault and preset run so far (rows, labelled
        "fault · preset" in the order first run), summed over their episodes; a row of zeros where none."""
        from collections import Counter

        import pandas as pd

        counts: dict[str, Counter] = {}
        for r in self.results:
            counts.setdefault(f"{r.fault} · {r.preset}", Counter()).update(r.violations["kind"])
        table = pd.DataFrame.from_dict(counts, orient="index").fillna(0).astype(int)
        return table[sorted(table.columns)].rename_axis(index="series", columns="kind")

    def clear(self) -> None:
        """Forget the results (the database keeps what the episodes wrote)."""
        self.results.clear()


def sum_ledger_counts(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Per tool, the sum of several :attr:`LabResult.ledger_counts` frames."""
    import pandas as pd

    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=list(LEDGER_COUNT_COLUMNS))
    return pd.concat(frames).groupby("tool", as_index=False)[["applied", "replayed"]].sum()


def lab_charts(session: LabSession, *, figsize: tuple[float, float] = (9, 8.4)):
    """The widget's two charts, one above the other: the session's rollback rates and the last episode's
    ledger. 9 x 8.4 inches (720 x 672 px as the widget draws it) fit a notebook in a 1,100 px wide window
    without being scaled down, so the text stays at its projector size."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(2, 1, figsize=figsize)
    rollback_rate_chart(session.history(), ax=left)
    last = session.last
    if last is not None:
        ledger_chart(last.ledger_counts, ax=right, title=f"Ledger of the last episode ({last.preset})")
    else:
        ledger_chart(sum_ledger_counts([]), ax=right)
    fig.tight_layout()
    return fig
