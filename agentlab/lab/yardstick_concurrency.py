"""The concurrency family against any agent: the agent's graph run twice at once on one customer.

The failure lab's five concurrency faults (:data:`agentlab.lab.faults.CONCURRENCY_FAULTS`) act on two
conversations; :mod:`agentlab.lab.concurrency` plays them on the kit's node. Here the two are two runs
of the *agent's own graph*, each built by its factory in a process of its own (two workers of one
deployment: their own autocommit pool, checkpointer pool and saver), each driven by its own scripted
model (seeds ``seed`` and ``seed + 1``) emitting the fault's tool calls:

====================  ==========================================================================
``same_thread_runs``  both runs on *one* thread (one request submitted twice at once)
the other four        two threads, one customer (``double_submit``, ``lost_update``,
                      ``check_then_act``, ``write_skew``)
====================  ==========================================================================

**The interleaving is forced from outside the agent's code.** The barrier
(:class:`agentlab.lab.rendezvous.Rendezvous`) sits on the connections of the pool the lab hands the
agent (:attr:`agentlab.lab.agents.AgentContext.pool`): the first statement of a run that is the
fault's act (the balance ``UPDATE``, the refund ``INSERT``: the domain's own SQL) waits until the other
run has reached its act too; then A's goes first and B's waits until A's connection is back in the
pool (r1 r2 w1 c1 w2 c2). An agent whose tools never send that statement through that pool (its own
connections, its own SQL) gives the barrier nothing to hold: the cell is ``n/a`` with that reason,
never a pass. The kit's agent runs as it is deployed: under a preset with ``run_lock``, each run holds
the thread's lease (:func:`agentlab.core.run_lock.invoke_with_lease`), and a refused run is reported as
``ThreadBusy (refused)``. What the runs raised is counted, not named by party (``1 of 2 runs: ...``).

The two runs play the harness's domain's race for the fault (``Domain.races``; billing's:
:mod:`agentlab.domains.billing.concurrency`), and the checker is the lab's
(:func:`agentlab.lab.concurrency.check_pair`): on billing, its invariants on the union of both runs' effects,
the message checks on each thread's own history, and the family's (:data:`agentlab.lab.concurrency.KINDS`:
``paid_twice``, ``lost_update``, ``cap_exceeded``, ``forked_thread``), read from the database, the
provider's payments and the checkpoints.

Sources: PostgreSQL docs "Transaction Isolation", "Explicit Locking"; LangGraph docs "Persistence"
(threads and checkpoints), langgraph#8796 (two runs on one thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import HumanMessage

from agentlab.core.races import RaceEpisode
from agentlab.core.run_lock import ThreadBusy, invoke_with_lease
from agentlab.lab import loop
from agentlab.lab.agents import (
    AgentSpec,
    as_domain_messages,
    describe_raised,
    rename_script,
)
from agentlab.lab.clients.pairs import PairClient, PairRun, ThreadsWorker
from agentlab.lab.concurrency import check_pair
from agentlab.lab.faults import Concurrent
from agentlab.lab.rendezvous import Rendezvous, meets_at
from agentlab.lab.wire import NetworkProvider
from agentlab.lab.yardstick_faults import NA
from agentlab.runtime.harness import Episode

PARTIES = ("A", "B")
BARRIER_S = 10.0  # the barrier's bound per phase; it lets go early as soon as the other run arrived, ended or
# waits on this one's lock, so only a load that stalls a run this long changes the interleaving
REFUSED = "ThreadBusy (refused)"


@dataclass
class Run:
    """One of the two runs: its party name, thread, scenario and model seed; how it ended (``raised``:
    what it raised, ``None`` when it ended) and the graph it ran (to read its thread back)."""

    party: str
    thread_id: str
    scenario: Any
    seed: int
    raised: str | None = None
    graph: Any = None
    messages: list = field(default_factory=list)


class AgentPair:
    """The two runs of one agent's graph for :func:`run_two`, as the moves of a
    :class:`agentlab.lab.clients.pairs.PairClient`: ``setup`` (both processes up before either run starts: neither
    gets a head start), ``play_both``, ``settle`` (the work the agent left running), ``read`` (each thread's
    history), ``episode``, ``teardown`` and ``check`` (the state on the union, the messages per thread)."""

    def __init__(self, ys: Any, spec: AgentSpec, fault: Concurrent, out: Any, runs: list[Run], gate: Rendezvous,
                 thread: str, ids: list[int], rows: Any = None):
        self.ys, self.spec, self.fault, self.out, self.runs, self.gate = ys, spec, fault, out, runs, gate
        self.thread, self.ids, self.rows = thread, ids, rows
        self.sg = spec.checked_as
        self.names = dict(spec.tool_names)
        self.processes: list = []
        self.before = set(asyncio.all_tasks())
        self.threads = list(dict.fromkeys(r.thread_id for r in runs))
        self.histories: dict[str, list] = {}
        self.start_line: dict[str, asyncio.Event] = {r.party: asyncio.Event() for r in runs}

    async def setup(self) -> None:
        read = self.start_line
        for r in self.runs:
            process = await self.ys.open_process(self.processes)
            script = rename_script(r.scenario.script(self.ids), self.names)
            r.graph = self.ys.build(self.spec, process, script, r.seed, self.out,
                                    pool=self.gate.wrap(r.party, process.pool))
            leased = self.spec.safeguards is not None and self.sg.run_lock  # the lease already orders the two
            if self.fault.same_thread and process.saver is not None and not leased:
                # one request twice at once: both runs read the thread's (empty) checkpoint before either writes
                # its first, as two requests arriving together do; on a busy machine the second could otherwise
                # start after the first's checkpoint and simply continue it
                process.saver.on_first_read = read[r.party].set
                process.saver.before_first_put = functools.partial(self._others_read, r.party)

    async def _others_read(self, party: str) -> None:
        """Wait (at most :data:`BARRIER_S`) until every other run has read the thread's checkpoint or ended."""
        others = [e.wait() for p, e in self.start_line.items() if p != party]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*others), BARRIER_S)

    async def play(self, r: Run) -> None:
        kit, sg, h = self.spec.safeguards is not None, self.sg, self.ys.harness
        config = {"configurable": {"thread_id": r.thread_id, "tenant_id": r.scenario.tenant_id}}
        if kit:
            from agentlab.core.graph import run_config

            config = run_config(r.thread_id, tenant_id=r.scenario.tenant_id)
        inputs = {"messages": [HumanMessage(self.ys.prompt(r.scenario, self.ids))]}
        try:
            if kit and sg.run_lock:
                await invoke_with_lease(r.graph, h.pool, inputs, config, wait_ms=sg.run_lock_wait_ms,
                                        durability="async")
            else:
                await r.graph.ainvoke(inputs, config, durability="async")
        except ThreadBusy:
            r.raised = REFUSED
        except Exception as exc:  # noqa: BLE001 (what the agent raised is a result)
            r.raised = describe_raised(exc)
        finally:
            self.start_line[r.party].set()  # an ended run (refused by the lease, say) holds nobody at the start
            self.gate.leave(r.party)

    async def play_both(self) -> None:
        await asyncio.gather(*(self.play(r) for r in self.runs))

    async def settle(self) -> None:
        await self.ys.quiet(self.before)

    async def read(self) -> dict[str, list]:
        for r in self.runs:
            if r.thread_id not in self.histories:
                snapshot = await r.graph.aget_state({"configurable": {"thread_id": r.thread_id}})
                self.histories[r.thread_id] = list((snapshot.values if snapshot is not None else {}).get("messages", []))
        return self.histories

    def episode(self, histories: dict[str, list], drain) -> Episode:
        sc_a = self.runs[0].scenario
        return Episode(sc_a.name, self.spec.name, self.thread, self.out.seed, self.ids, self.sg.schema, sc_a.tenant_id,
                       messages=[m for t in self.threads for m in as_domain_messages(histories[t], self.names)])

    async def teardown(self) -> None:
        for p in self.processes:
            await p.close()

    async def check(self, ep: Episode) -> list:
        h = self.ys.harness
        histories = {t: as_domain_messages(self.histories[t], self.names) for t in self.threads}
        return await check_pair(h.pool, h.domain, self.sg, self.rows, self.runs[0].scenario, ep, self.threads,
                                histories)


async def run_two(ys: Any, spec: AgentSpec, fault: Concurrent, out: Any) -> Any:
    """Play ``fault`` with ``spec``'s graph run twice at once on the harness of ``ys`` (the
    :class:`agentlab.lab.yardstick.Yardstick` calling), check it, and fill ``out`` (its
    :class:`agentlab.lab.yardstick.AgentRun`, scenario and seed already chosen by ``Yardstick.run``); return it.

    ``out.raised`` names what the runs raised, by count, not by party (``"1 of 2 runs: UniqueViolation
    (23505)"``; ``None`` when both ended): which of two runs a lock or a lease lets through first is the
    server's choice, so the table stays the same for one seed; ``out.messages`` holds A's history, then B's when B had its own thread; ``out.notes`` holds
    ``rendezvous`` (what the barrier did), ``threads`` and ``raised_by`` (party -> what it raised).
    ``out.status`` is ``"n/a"`` when neither run sent the fault's act through the lab's pool."""
    h = ys.harness
    races = h.domain.races
    sg = spec.checked_as
    out.safeguards, out.outbox = sg, sg.outbox
    thread = f"{spec.name.replace(':', '-')}-{fault.name}-{uuid.uuid4().hex[:12]}"
    out.thread_id = thread
    async with h.pool.connection() as conn:
        rows = await races.create(conn, RaceEpisode(fault.name, out.scenario.name, sg.schema))
    sc_a, sc_b = races.scenarios(out.scenario.name, rows)
    out.customer_ids = ids = list(races.ids(rows)) if races.ids is not None else []
    runs = [Run("A", thread, sc_a, out.seed), Run("B", thread if fault.same_thread else f"{thread}-b", sc_b, out.seed + 1)]
    gate = Rendezvous(h.pool, PARTIES, meets_at(*races.acts), timeout_s=BARRIER_S)
    out.network_provider = NetworkProvider(h.provider)
    pair = AgentPair(ys, spec, fault, out, runs, gate, thread, ids, rows)
    client = PairClient(PairRun(h, sg, thread, out.seed, ThreadsWorker(h.pool, out.network_provider, pair.threads),
                                notes=out.notes),
                        play=pair.play_both, read=pair.read, episode=pair.episode, setup=pair.setup,
                        teardown=pair.teardown, settle=pair.settle, flush=h.events.flush)
    _, out.violations = await loop.run(client, loop.Workload(sc_a, ys.prompt(sc_a, ids)), fault, pair.check)
    out.messages = [m for t in pair.threads for m in pair.histories[t]]
    raised = {r.party: r.raised for r in runs if r.raised}
    out.raised = "; ".join(f"{n} of 2 runs: {what}" for what, n in Counter(raised.values()).items()) or None
    out.notes.update(rendezvous=gate.account(), threads=pair.threads, raised_by=raised)
    if not gate.arrived:
        out.status = NA
        out.reason = (f"the barrier meets at the domain's statement for this anomaly; {spec.name}'s tools never "
                      "sent it through the pool the lab hands them, so the interleaving could not be forced")
    return out
