"""tau2-bench retail replayed through the kit: each task's golden actions under a preset and a fault.

Each task runs on the opening state: a :class:`Tau2Worker` holds one database (a copy of the retail
template, :func:`agentlab.runtime.db.create_database`) and puts it back after each task
(:func:`agentlab.domains.retail.reset.reset_state`); the task runs through the graph and the :class:`~agentlab.core.batch.TransactionalToolsNode` of the failure lab
(:meth:`agentlab.lab.runner.Lab.run`): each golden action is one model turn with one tool call, id
``tau2-<task>-<action_id>`` (:class:`Tau2Model`). Then the end state is exported in tau2's ``RetailDB``
shape, hashed (:func:`agentlab.domains.retail.export.canonical_hash`), compared with the hash tau2's own
code gives (``data/retail/expected_hashes.json``), and checked by the generic invariants and retail's own.

The faults (:data:`agentlab.lab.tau2_faults.TAU2_FAULTS`) are the catalog's, fitted to turns of one call each:

=========================  ================================================================================
``none``                   the control row
``crash_mid_node``         the process dies inside a multi-row write: between the first and the second write
                           statement of a tool call (cancel, modify items, modify payment); resume in a new process
``backend_killed``         at that same point another session runs ``pg_terminate_backend`` on the node's backend
``crash_before_checkpoint``  the process dies after the first writing batch's COMMIT, before its checkpoint
``hallucinated_order_id``  every order id is first sent without its ``#`` (``W2378156``); the model resends it
                           fixed once told the order was not found
``check_violation``        every cancel reason is first sent capitalized (``No longer needed``): the CHECK on
                           ``orders.cancel_reason`` refuses the UPDATE, after a gift card's refund statement
``fk_violation``           every exchange first names the description's example payment method of its kind
                           (``gift_card_0000000``): the FOREIGN KEY on the order's exchange payment method refuses it
``lock_timeout``           another session holds the first written order's row lock (``FOR UPDATE``) for 1 s
``statement_timeout``      a trigger holds the first written order's first write (its row, an item, a new
                           payment) until 0.25 s past the statement timeout (scaled to 250 ms where timeouts
                           are on), once: the retry does not wait
=========================  ================================================================================

``await run_tau2(["full", "naive"], ["none", "crash_mid_node"])`` returns a :class:`Tau2Result`;
``python -m agentlab tau2`` prints its table (:func:`main`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from agentlab.core.safeguards import Safeguards
from agentlab.core.scenario import Scenario
from agentlab.domains.retail.domain import DOMAIN, DOMAIN_FIXED
from agentlab.domains.retail.export import canonical_hash
from agentlab.domains.retail.load import read_expected_hashes
from agentlab.domains.retail.reset import OpeningPieces, reset_state
from agentlab.lab.faults import (
    Fault,
)
from agentlab.lab.runner import Lab
from agentlab.lab.tau2_faults import (  # noqa: F401 (the faults' names, importable from here as before)
    EXAMPLE_PAYMENT_METHOD_NUMBER,
    FAULTS,
    LOCK_HOLD_S,
    ORDER_SHOT_PREFIX,
    ORDER_SLOW_DDL,
    ORDER_SLOW_INSTALLED,
    ORDER_SLOW_SEEN,
    TAU2_FAULTS,
    WRITE_PREFIXES,
    CrashAfterWriteCommit,
    FirstSentWrong,
    MidWrite,
    OrderLockHolder,
    SlowOrderWrite,
    WatchedCursor,
    WatchingPool,
    WriteWatchingConnection,
    capitalized,
    example_payment_method,
    first_written_order,
    get_fault,
    without_hash,
)
from agentlab.runtime.db import template_name
from agentlab.runtime.harness import Harness
from agentlab.sim.model import PLAN_KEY, ScriptedChatModel

DEFAULT_CONCURRENCY = 4  # workers, each a database of its own running one task at a time


# --------------------------------------------------------------------------- the model

class Tau2Model(ScriptedChatModel):
    """The scripted model, with the tool call ids of tau2's golden actions: step ``s`` is sent as
    ``call_ids[s]``, a resend of it as ``<id>-2``, ``<id>-3``, ... (a new id per send, as an LLM's)."""

    call_ids: list[str] = Field(default_factory=list)

    def _generate(self, messages, stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        result = super()._generate(messages, stop=stop, **kwargs)
        message = result.generations[0].message
        if not message.tool_calls:
            return result
        used = {tc["id"] for m in messages if isinstance(m, AIMessage) for tc in m.tool_calls}
        calls = []
        for tc, (step, _index) in zip(message.tool_calls, message.response_metadata[PLAN_KEY]):
            base = self.call_ids[step]
            cid, n = base, 1
            while cid in used:
                n += 1
                cid = f"{base}-{n}"
            used.add(cid)
            calls.append({**tc, "id": cid})
        renamed = AIMessage(content=message.content, tool_calls=calls, response_metadata=message.response_metadata,
                            usage_metadata=message.usage_metadata)
        return ChatResult(generations=[ChatGeneration(message=renamed)])


def model_for(scenario: Scenario):
    """A :meth:`Lab.run` model factory for a task scenario (its call ids are in ``scenario.intended``)."""
    ids = list(scenario.intended["call_ids"])
    return lambda script, seed: Tau2Model(script=script, seed=seed, call_ids=ids)




# --------------------------------------------------------------------------- one task

@dataclass
class TaskRun:
    """One task under one preset and fault: the end state's canonical hash against tau2's, and the violations."""

    task_id: str
    preset: str
    fault: str
    state_hash: str
    expected_hash: str
    violations: list[tuple[str, str]]
    crashed: bool = False
    error: str | None = None
    notes: dict = field(default_factory=dict)
    messages: list = field(default_factory=list, repr=False)
    wall_s: float = 0.0
    state: dict | None = field(default=None, repr=False)
    escalated: bool = False  # the graph escalated (to a person) and ended the run before the script did

    @property
    def matches(self) -> bool:
        return self.state_hash == self.expected_hash

    def trace(self, tools: Iterable[str] | None = None):
        """The tool calls of the kept message history as a DataFrame: call id, tool, and the head of its
        ToolMessage(s) (``-`` when none answered it); only ``tools`` when given."""
        import pandas as pd

        answers: dict[str, list[str]] = {}
        for m in self.messages:
            if isinstance(m, ToolMessage):
                answers.setdefault(m.tool_call_id, []).append(" ".join(str(m.content).split())[:70])
        wanted = set(tools) if tools is not None else None
        rows = [{"call id": tc["id"], "tool": tc["name"], "answer": " | ".join(answers.get(tc["id"], ["-"]))}
                for m in self.messages if isinstance(m, AIMessage) for tc in m.tool_calls
                if wanted is None or tc["name"] in wanted]
        return pd.DataFrame(rows, columns=["call id", "tool", "answer"])

    def as_dict(self) -> dict[str, Any]:
        return {"task": self.task_id, "preset": self.preset, "fault": self.fault, "hash": self.state_hash,
                "matches": self.matches, "violations": [{"kind": k, "detail": d} for k, d in self.violations],
                "crashed": self.crashed, "escalated": self.escalated, "error": self.error}


class Tau2Worker:
    """One database (a copy of the retail template) and one :class:`Lab` on it, for tasks one at a time:
    after each task the database goes back to the opening state (:func:`reset_state`, a few milliseconds)
    instead of a new copy per task, and the end state is hashed from the entities the task wrote
    (:class:`OpeningPieces`), not from a full export.

    ``await Tau2Worker(domain).open()``, then :meth:`run` any number of times, then :meth:`close`
    (drops the database). The database commits with ``synchronous_commit = off``, as the chaos command's
    (a server crash could lose its last commits; no fault here crashes the server).
    """

    def __init__(self, domain=DOMAIN, *, expected: dict | None = None):
        self.domain = domain
        self.expected = read_expected_hashes() if expected is None else expected
        self.harness: Harness | None = None
        self.lab: Lab | None = None
        self.pieces: OpeningPieces | None = None
        self._backend_cpu0: dict[int, float] | None = None

    async def open(self) -> Tau2Worker:
        from agentlab.lab.experiments import commit_without_flush_wait
        from agentlab.runtime import db

        url = await asyncio.to_thread(db.create_database, "tau2", self.domain)
        try:
            await asyncio.to_thread(commit_without_flush_wait, url)  # as the chaos command's: a commit's fsync is the disk's time
            self.harness = await Harness.open(url, domain=self.domain, pool_max=2)
        except BaseException:
            await asyncio.to_thread(db.drop_database, url)
            raise
        self.harness.owns_database = True  # made here: dropped by close()
        try:
            self.lab = await Lab(self.harness, pool_max=2, checkpointer_max=2).start()
            self.pieces = await _opening_pieces(self.harness)
            self._backend_cpu0 = await self._backend_cpu()
        except BaseException:
            await self.close()
            raise
        return self

    async def _backend_cpu(self) -> dict[int, float] | None:
        """CPU seconds (user + system) of each server backend on this worker's database, read from
        ``/proc`` (None when the server's processes are not visible from here)."""
        async with self.harness.pool.connection() as conn:
            cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            pids = [r[0] for r in await cur.fetchall()]
        out = {pid: _proc_cpu_s(pid) for pid in pids}
        return None if None in out.values() else out

    async def server_cpu_s(self) -> float | None:
        """CPU seconds the server spent on this worker's database since :meth:`open`, summed over the
        backends alive now (one a fault killed is not counted); None when ``/proc`` does not show them."""
        now = await self._backend_cpu()
        if now is None or self._backend_cpu0 is None:
            return None
        return sum(cpu - self._backend_cpu0.get(pid, 0.0) for pid, cpu in now.items())

    async def close(self) -> None:
        if self.lab is not None:
            await self.lab.close()
        if self.harness is not None:
            await self.harness.close()
        self.lab = self.harness = None

    async def __aenter__(self) -> Tau2Worker:  # noqa: PYI034
        return await self.open()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def run(self, task_id: str, preset: str | Safeguards = "full", fault: str | Fault = "none", *,
                  keep_messages: bool = False, keep_state: bool = False) -> TaskRun:
        """Replay task ``task_id`` under ``preset`` and ``fault`` (see :func:`run_task`), then reset."""
        name = f"tau2-{task_id}"
        if name not in self.domain.scenarios:
            raise ValueError(f"unknown tau2 task {task_id!r}: the tasks are 0 to {len(self.domain.scenarios) - 1}")
        fault = get_fault(fault) if isinstance(fault, str) else fault
        scenario = self.domain.scenarios[name]
        h = self.harness
        t0 = time.perf_counter()
        try:
            fr = await self.lab.run(fault, preset, scenario=scenario, model=model_for(scenario))
            async with h.pool.connection() as conn:
                if keep_state:
                    state = await self.domain.export_state(conn, [])
                    state_hash = canonical_hash(state)
                else:
                    state, state_hash = None, await self.pieces.state_hash(conn)
        finally:
            async with h.pool.connection() as conn:
                await reset_state(conn)
        ep = fr.episode
        return TaskRun(str(task_id), fr.preset, fault.name, state_hash, self.expected["hashes"][str(task_id)],
                       [(v.kind, v.detail) for v in fr.violations], fr.crashed, ep.error, dict(fr.notes),
                       list(ep.messages) if keep_messages else [], time.perf_counter() - t0, state,
                       escalated=ep.escalated)


def _proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``), or None when not visible."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_OPENING: dict[str, OpeningPieces] = {}


async def _opening_pieces(h: Harness) -> OpeningPieces:
    """The opening state's pieces, exported once per process and template (a fresh copy holds it)."""
    key = template_name(h.domain)
    if key not in _OPENING:
        async with h.pool.connection() as conn:
            _OPENING[key] = OpeningPieces(await h.domain.export_state(conn, []))
    return _OPENING[key]


async def run_task(task_id: str, preset: str | Safeguards = "full", fault: str | Fault = "none", *,
                   fixed: bool = False, expected: dict | None = None, keep_messages: bool = False,
                   keep_state: bool = False) -> TaskRun:
    """Replay task ``task_id``'s golden actions under ``preset`` and ``fault`` on a fresh database (a
    :class:`Tau2Worker` of its own, closed at the end).

    Args:
        preset: a preset name or a :class:`~agentlab.core.safeguards.Safeguards`.
        fixed: run the domain with tau2's last-variant bug fixed (:data:`DOMAIN_FIXED`).
        expected: ``expected_hashes.json`` as read (read once when None).
        keep_messages: keep the message history in the result (for a trace: :meth:`TaskRun.trace`).
        keep_state: keep the exported end state (tau2's ``RetailDB`` JSON) in ``TaskRun.state``.

    Raises:
        ValueError: an unknown task or fault.
        agentlab.runtime.db.DatabaseUnavailable: no server.
    """
    domain = DOMAIN_FIXED if fixed else DOMAIN
    if f"tau2-{task_id}" not in domain.scenarios:
        raise ValueError(f"unknown tau2 task {task_id!r}: the tasks are 0 to {len(domain.scenarios) - 1}")
    fault = get_fault(fault) if isinstance(fault, str) else fault
    async with Tau2Worker(domain, expected=expected) as worker:
        return await worker.run(task_id, preset, fault, keep_messages=keep_messages, keep_state=keep_state)


# --------------------------------------------------------------------------- the table

@dataclass
class Tau2Result:
    """Every :class:`TaskRun` of a run, how long it took (seconds) and the CPU time this process spent."""

    runs: list[TaskRun]
    presets: list[str]
    faults: list[str]
    tasks: list[str]
    seconds: float
    cpu_s: float = 0.0  # this process's CPU time (user + system) during the run, seconds
    server_cpu_s: float | None = None  # the server's, on the workers' databases (Tau2Worker.server_cpu_s)

    def table(self) -> list[dict[str, Any]]:
        """One row per preset and fault: tasks matched (of the tasks run), errors, runs the graph escalated
        (ended for a person after ``max_rollbacks`` refused batches in a row) and violations by kind."""
        rows = []
        for p in self.presets:
            for f in self.faults:
                runs = [r for r in self.runs if r.preset == p and r.fault == f]
                kinds = Counter(k for r in runs for k, _ in r.violations)
                rows.append({"preset": p, "fault": f, "matched": sum(r.matches for r in runs), "of": len(runs),
                             "errors": sum(r.error is not None for r in runs),
                             "escalated": sum(r.escalated for r in runs), "violations": dict(sorted(kinds.items()))})
        return rows

    def frame(self):
        """:meth:`table` as a pandas DataFrame, one column per violation kind (for a notebook)."""
        import pandas as pd

        rows = self.table()
        kinds = sorted({k for r in rows for k in r["violations"]})
        return pd.DataFrame([{"preset": r["preset"], "fault": r["fault"], "matched": f"{r['matched']}/{r['of']}",
                              **{k: r["violations"].get(k, 0) for k in kinds}} for r in rows])

    def to_json(self) -> dict[str, Any]:
        return {"presets": self.presets, "faults": self.faults, "tasks": self.tasks,
                "seconds": round(self.seconds, 2), "cpu_s": round(self.cpu_s, 2),
                "server_cpu_s": None if self.server_cpu_s is None else round(self.server_cpu_s, 2),
                "table": self.table(),
                "runs": [r.as_dict() for r in self.runs]}


async def run_tau2(presets: Sequence[str] = ("full",), faults: Sequence[str] = ("none",),
                   tasks: Iterable[str] | None = None, *, fixed: bool = False,
                   concurrency: int = DEFAULT_CONCURRENCY, progress: bool | None = None) -> Tau2Result:
    """Run ``tasks`` (default: all 114) under every preset and fault, ``concurrency`` tasks at a time.

    Raises:
        ValueError: an unknown preset, fault or task (before anything runs).
    """
    from tqdm.auto import tqdm

    from agentlab.core.safeguards import preset as get_preset

    for p in presets:
        get_preset(p)
    for f in faults:
        get_fault(f)
    domain = DOMAIN_FIXED if fixed else DOMAIN
    task_ids = [str(t) for t in tasks] if tasks is not None else [s.intended["task_id"] for s in domain.scenarios.values()]
    for t in task_ids:
        if f"tau2-{t}" not in domain.scenarios:
            raise ValueError(f"unknown tau2 task {t!r}: the tasks are 0 to {len(domain.scenarios) - 1}")
    expected = read_expected_hashes()
    jobs = [(p, f, t) for p in presets for f in faults for t in task_ids]
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    bar = tqdm(total=len(jobs), disable=disable, unit="task", desc="tau2", leave=False)
    t0, cpu0 = time.perf_counter(), time.process_time()
    queue: asyncio.Queue = asyncio.Queue()
    # run task by task across the presets and faults, so that the faults that wait (a held lock, a slow
    # statement) overlap with those that compute; the result keeps the preset-fault-task order
    for n, job in sorted(enumerate(jobs), key=lambda nj: (task_ids.index(nj[1][2]), nj[0])):
        queue.put_nowait((n, job))
    runs: list[TaskRun | None] = [None] * len(jobs)

    server_cpu: list[float | None] = []

    async def work() -> None:
        async with Tau2Worker(domain, expected=expected) as worker:
            while not queue.empty():
                n, (p, f, t) = queue.get_nowait()
                try:
                    runs[n] = await worker.run(t, p, f)
                finally:
                    bar.update(1)
            server_cpu.append(await worker.server_cpu_s())

    try:
        await asyncio.gather(*(work() for _ in range(max(1, min(concurrency, len(jobs))))))
    finally:
        bar.close()
    return Tau2Result(list(runs), list(presets), list(faults), task_ids, time.perf_counter() - t0,
                      time.process_time() - cpu0, None if None in server_cpu else sum(server_cpu))


def render(result: Tau2Result) -> str:
    """The table as text: preset, fault, matched/of, runs the graph escalated, then each violation kind's count."""
    rows = result.table()
    kinds = sorted({k for r in rows for k in r["violations"]})
    head = ["preset", "fault", "matched", "escalated", *kinds]
    body = [[r["preset"], r["fault"], f"{r['matched']}/{r['of']}", str(r["escalated"]),
             *(str(r["violations"].get(k, 0)) for k in kinds)] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in (head, *body)]
    server = "" if result.server_cpu_s is None else f", {result.server_cpu_s:.1f} s of the server's"
    return "\n".join(lines) + (f"\n{len(result.runs)} task runs in {result.seconds:.1f} s "
                               f"({result.cpu_s:.1f} s of this process's CPU{server})")


# --------------------------------------------------------------------------- command line

def main(args) -> int:
    """Run the command; 0 when it ran (whatever matched), 2 on a bad argument."""
    faults = list(TAU2_FAULTS) if args.faults == ["all"] else args.faults
    try:
        result = asyncio.run(run_tau2(args.presets, faults, args.tasks, fixed=args.fixed,
                                      concurrency=args.concurrency, progress=None if not args.json else False))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=1) if args.json else render(result))
    return 0


__all__ = ["FAULTS", "MidWrite", "SlowOrderWrite", "TaskRun", "Tau2Model", "Tau2Result", "Tau2Worker", "get_fault",
           "render", "run_task", "run_tau2"]
