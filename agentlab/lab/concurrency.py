"""Two conversations, one row: the failure lab's faults of real concurrency, their runner and checker.

Every other fault acts on one conversation. These run **two** at once on the same rows, each a real graph run
with its own scripted model (seeds ``seed`` and ``seed + 1``, so fresh tool call ids), its own tools node and
its own connections, and force the interleaving that breaks a first draft. What the two do is the domain's: its
races (``Domain.races``, :class:`agentlab.core.races.Races`), which this module plays for every domain the same
way (:func:`run_concurrent`): the episode's rows (``races.create``), the two conversations' scenarios, the
statements they meet at, and the race's invariants. Billing's races
(:mod:`agentlab.domains.billing.concurrency`, its table of what the two conversations do) are redemptions of
store credit (``RedeemCredit``) and refunds under a daily cap (``RefundWithinCap``) on one customer.

**The interleaving is forced, not hoped for.** A :class:`agentlab.lab.rendezvous.Rendezvous` sits in front
of each conversation's tools node connections: both read before either writes at the race's *act*, then A's
act goes first and B's waits until A's batch has ended (r1 r2 w1 c1 w2 c2); :mod:`agentlab.lab.rendezvous`
says when a wait ends early. Same seed, same interleaving, same table.

Invariants (:func:`check_pair`, read from the database and the checkpoints, never from the code): the race's
own (``races.check``; billing's :data:`KINDS` but ``forked_thread``), ``forked_thread`` (a thread's checkpoints
do not form one chain: two roots, or a checkpoint with two children), and the generic ones, judged as the races
say (``races.union``): billing's on the union of both threads' effects, as one episode, against the end state
both together intend; retail's on each thread apart.

What holds billing's (:class:`agentlab.core.safeguards.Safeguards`): the per-run thread lease (``run_lock``)
for ``same_thread_runs``; natural keys (``constraints``: UNIQUE customer + reference) for
``double_submit`` (the refund story itself is no good double-submit case under ``full``: its
``ApplyCredit`` is a bare deduction with no natural key, and a model that resends it after the twin's
memo conflict deducts twice, see case C23); a row lock in the check-then-act tool (``row_locks``) or ``repeatable read``
(the late writer fails with 40001 and the graph retries it) for ``lost_update`` and ``check_then_act``;
the row lock or ``serializable`` for ``write_skew`` (repeatable read lets it through). ``full`` holds all.

On the retail domain (``chaos --domain retail``) the same faults play retail's own races on rows each
episode makes for itself, met at the tools' first writes, and checked by the retail invariants
(:mod:`agentlab.domains.retail.concurrency`); ``write_skew`` does not apply there and :func:`domain_races`
refuses it with the reason.

Sources: PostgreSQL docs "Transaction Isolation", "Explicit Locking", "Serializable Snapshot Isolation"
(wiki SSI; Ports and Grittner, VLDB 2012), ``pg_blocking_pids``; Kingsbury, Jepsen analyses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import HumanMessage

from agentlab.core.domain import Violation
from agentlab.core.graph import RETRY_ATTEMPTS, build_graph, run_config
from agentlab.core.races import RaceEpisode, forked_threads
from agentlab.core.run_lock import ThreadBusy, thread_lease
from agentlab.core.scenario import Scenario
from agentlab.lab import loop
from agentlab.lab.clients.pairs import PairClient, PairRun, ThreadsWorker
from agentlab.lab.faults import (  # noqa: F401 (importable from here as before)
    CONCURRENCY_FAULTS,
    DOMAIN_RACES,
    RENDEZVOUS_S,
    Concurrent,
    domain_races,
)
from agentlab.lab.rendezvous import (  # noqa: F401 (the barrier moved to agentlab.lab.rendezvous; importable here)
    BLOCKED_BY,
    POLL_S,
    Rendezvous,
    meets_at,
)
from agentlab.runtime.harness import Episode

KINDS: tuple[str, ...] = ("paid_twice", "lost_update", "cap_exceeded", "forked_thread")
"""The family's kinds on billing: its races' (:data:`agentlab.domains.billing.concurrency.KINDS`) and
``forked_thread``, which every domain's races are checked for."""


async def check_pair(pool, domain, safeguards, rows: Any, scenario: Any, ep: Episode, threads: list[str],
                     histories: dict[str, list]) -> list[Violation]:
    """Every violation of one episode of ``domain``'s races (``domain.races``), read from the database, the
    provider's records, the checkpoints and the messages, on connections of ``pool``.

    Args:
        safeguards: the :class:`agentlab.core.safeguards.Safeguards` the episode ran under.
        rows: what ``races.create`` made for the episode.
        scenario: A's scenario (its ``intended``: the end state both conversations together mean to reach).
        ep: the episode (:class:`agentlab.runtime.harness.Episode`): A's thread, the rows' ids, both threads'
            messages in ``messages``.
        threads: the episode's threads, A's first (one when both ran on one thread).
        histories: each thread's own messages, as the domain's tools name them.

    In this order: with ``races.union``, the domain's invariants on both threads' effects as one episode, the
    ledger on both threads' calls (:func:`agentlab.lab.invariants.check_records`) and the message checks on each
    thread's history; without, the generic checks on each thread apart
    (:func:`agentlab.lab.invariants.check_generic`); then the race's own (``races.check``, A's thread's) and
    ``forked_thread`` on each thread (:func:`agentlab.core.races.forked_threads`).

    Raises:
        agentlab.core.errors.DomainError: a domain invariant raised (a domain bug, not a violation).
    """
    from agentlab.lab.invariants import check_generic, check_invariants, check_messages, check_records

    races, identifiers = domain.races, domain.error_hints.identifiers
    found: list[Violation] = []
    if races.union:
        found += await check_invariants(pool, ep, scenario, domain)
        found += await check_records(pool, ep, safeguards, skip={inv.kind for inv in domain.invariants},
                                     threads=threads)
        for t in threads:
            found += check_messages(histories[t], t, safeguards, identifiers)
    else:
        for t in threads:
            one = dataclasses.replace(ep, thread_id=t, messages=histories[t])
            found += await check_generic(pool, one, safeguards, identifiers)
    async with pool.connection() as conn:
        found += [Violation(kind, ep.thread_id, detail) for kind, detail in await races.check(conn, rows)]
        found += [Violation("forked_thread", t, detail) for t, detail in await forked_threads(conn, threads)]
    return found


# --------------------------------------------------------------------------- the runner

@dataclass
class Conversation:
    """One of the two: its name, thread, scenario, model seed, and how it ended."""

    name: str
    thread_id: str
    scenario: Scenario
    seed: int
    state: dict = field(default_factory=dict)
    refused: str | None = None
    error: str | None = None


async def run_concurrent(lab, fault: Concurrent, sg, *, scenario: str, seed: int, rng: random.Random,
                         check: bool = True, model=None):
    """Run and check one episode of ``fault`` on ``lab`` (an :class:`agentlab.lab.runner.Lab`) with the races of its
    harness's domain (``domain.races``, :class:`agentlab.core.races.Races`): the episode's rows
    (``races.create``), race ``scenario`` played by two conversations at once met at ``races.acts``, the outbox
    drained, then :func:`check_pair` (unless ``check`` is false). ``rng`` is unused (the race names its calls).

    Returns ``(episode, end state scenario, notes, violations)``; the runner makes its FaultRun of them. The end
    state scenario is A's (its ``intended``: what both together mean to reach). ``notes`` holds ``rendezvous``
    (what the barrier did), ``refused`` (conversations the thread lease refused), ``errors``, ``threads``,
    ``race`` and what ``races.notes`` shows of the rows (retail: ``user_id``).

    Raises:
        ValueError: the domain states no races, the fault does not apply to it, or it has no race ``scenario``
            for the fault.
    """
    h = lab.harness
    races = h.domain.races
    names = domain_races(h.domain, fault.name)
    if scenario not in names:
        raise ValueError(f"domain {h.domain.name!r} has no race {scenario!r} for fault {fault.name!r}; its races "
                         f"for it: {', '.join(names)}")
    t0 = time.perf_counter()
    async with h.pool.connection() as conn:
        rows = await races.create(conn, RaceEpisode(fault.name, scenario, sg.schema))
    sc_a, sc_b = races.scenarios(scenario, rows)
    ids = list(races.ids(rows)) if races.ids is not None else []
    thread = f"{fault.name}-{sg.name}-{uuid.uuid4().hex[:12]}"
    convs = [Conversation("A", thread, sc_a, seed),
             Conversation("B", thread if fault.same_thread else f"{thread}-b", sc_b, seed + 1)]
    gate = Rendezvous(h.pool, ("A", "B"), meets_at(*races.acts))

    async def checker(ep, threads: list[str], histories: dict[str, list]) -> list[Violation]:
        return await check_pair(h.pool, h.domain, sg, rows, sc_a, ep, threads, histories)

    ep, threads, _, violations = await _play_pair(lab, sg, convs, gate, ids, model, thread, fault,
                                                  checker if check else None)
    errors = [f"{c.name}: {c.error}" for c in convs if c.error]
    ep.wall_ms = (time.perf_counter() - t0) * 1000
    notes: dict[str, Any] = {"rendezvous": gate.account(), "refused": [c.name for c in convs if c.refused],
                             "errors": errors, "threads": threads, "race": scenario,
                             **(races.notes(rows) if races.notes is not None else {})}
    return ep, sc_a, notes, violations


async def _play_pair(lab, sg, convs: list[Conversation], gate: Rendezvous, ids: list[int], model, thread: str,
                     fault, checker=None):
    """Both conversations at once (each a graph run of its own, under the thread lease with ``run_lock``), played
    through the lab's one loop (:class:`agentlab.lab.clients.pairs.PairClient`): their histories read back, the
    outbox drained, then ``await checker(ep, threads, histories)`` (None: no check). Returns ``(episode, threads,
    histories by thread, violations)``."""
    from agentlab.sim.model import ScriptedChatModel

    h, process = lab.harness, lab.process
    make_model = model or (lambda script, seed: ScriptedChatModel(script=script, seed=seed))

    # On a shared thread under the run lock, A asks for the lease first and B only once A has it (or was
    # refused): the request submitted twice at once reaches the lease in one order on every run, and the
    # one refused is always B (which of two gathered tasks reached the server first was the event loop's
    # choice, and a loaded machine sometimes let B in first).
    lease_asked = asyncio.Event()

    async def play(c: Conversation) -> None:
        node = process.node(sg)
        node.pool = gate.wrap(c.name, node.pool)
        graph = build_graph(make_model(c.scenario.script(ids), c.seed), node, checkpointer=process.saver,
                            retry_attempts=RETRY_ATTEMPTS)
        config = run_config(c.thread_id, tenant_id=c.scenario.tenant_id)
        inputs = {"messages": [HumanMessage(c.scenario.prompt)]}
        try:
            if sg.run_lock:
                # on a shared thread only the lease holder can reach its act: the other waits for the run to end
                shared = sum(o.thread_id == c.thread_id for o in convs) > 1
                first = c is convs[0]
                if shared:
                    gate.queued.add(c.name)
                    if not first:
                        await lease_asked.wait()
                try:
                    async with thread_lease(h.pool, c.thread_id, wait_ms=sg.run_lock_wait_ms) as lease:
                        gate.queued.discard(c.name)
                        if first:
                            lease_asked.set()
                        c.state = await graph.ainvoke(inputs, lease.configure(config), durability="exit")
                finally:
                    gate.queued.discard(c.name)
            else:
                c.state = await graph.ainvoke(inputs, config, durability="exit")
        except ThreadBusy as exc:
            c.refused = str(exc)
        except Exception as exc:
            c.error = f"{type(exc).__name__}: {exc}"
        finally:
            gate.leave(c.name)
            if c is convs[0]:
                lease_asked.set()  # whatever ended A, B never waits for it

    threads = list(dict.fromkeys(c.thread_id for c in convs))
    histories: dict[str, list] = {}

    async def play_both() -> None:
        await asyncio.gather(*(play(c) for c in convs))

    async def read() -> dict:
        values_by_thread = {}
        for t in threads:
            snapshot = await process.graph(sg).aget_state(run_config(t))
            values_by_thread[t] = snapshot.values if snapshot is not None else {}
            histories[t] = list(values_by_thread[t].get("messages", []))
        return values_by_thread

    def episode(values_by_thread: dict, drain) -> Episode:
        sc_a = convs[0].scenario
        ep = Episode(sc_a.name, sg.name, thread, convs[0].seed, ids, sg.schema, sc_a.tenant_id)
        for values in values_by_thread.values():
            ep.rollbacks_total += values.get("rollbacks_total", 0)
            ep.escalated |= bool(values.get("escalated", False))
        if drain is not None:
            ep.drain = drain
        ep.messages = [m for t in threads for m in histories[t]]
        ep.error = "; ".join(f"{c.name}: {c.error}" for c in convs if c.error) or None
        return ep

    run = PairRun(h, sg, thread, convs[0].seed, ThreadsWorker(process.pool, h.provider, threads))
    client = PairClient(run, play=play_both, read=read, episode=episode)
    check = (lambda ep: checker(ep, threads, histories)) if checker is not None else None
    ep, violations = await loop.run(client, loop.Workload(convs[0].scenario, convs[0].scenario.prompt), fault, check)
    return ep, threads, histories, violations
