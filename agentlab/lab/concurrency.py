"""Two conversations, one row: the failure lab's faults of real concurrency, their invariants, their runner.

Every other fault acts on one conversation. These run **two** at once on the same customer, each a
real graph run with its own scripted model (seeds ``seed`` and ``seed + 1``, so fresh tool call ids),
its own tools node and its own connections, and force the interleaving that breaks a first draft:

========================  ================================================================================
fault                     the two conversations
========================  ================================================================================
``same_thread_runs``      one request (``RedeemCredit`` 2,000 of 5,000) submitted twice at once on *one*
                          thread (case C18, langgraph#8796; its test plays the refund story)
``double_submit``         one refund (``RefundWithinCap`` 2,000, one reference) sent twice at once on two
                          threads (a double click, two support agents)
``lost_update``           two redemptions that both fit the credit (``RedeemCredit`` 2,000 and 1,500 of 5,000)
``check_then_act``        two redemptions that each fit alone, not together (3,000 and 3,000 of 5,000)
``write_skew``            two refunds under the daily cap that each fit alone (``RefundWithinCap`` 3,000 and
                          3,000 under a 5,000 cap, two references)
========================  ================================================================================

**The interleaving is forced, not hoped for.** A :class:`agentlab.lab.rendezvous.Rendezvous` sits in front
of each conversation's tools node connections: both read before either writes at the fault's *act*, then A's
act goes first and B's waits until A's batch has ended (r1 r2 w1 c1 w2 c2); :mod:`agentlab.lab.rendezvous`
says when a wait ends early. Same seed, same interleaving, same table.

Invariants (:data:`KINDS`, read from the database and the checkpoints, never from the code):

==================  ===================================================================================
``paid_twice``      one customer holds two refunds (or two payments at the provider) for one reference,
                    or two credit memos for one reference
``lost_update``     a balance differs from its opening value minus every redemption recorded against it
``cap_exceeded``    the day's refunds of a customer exceed the daily cap, or more credit was redeemed than
                    the customer had
``forked_thread``   a thread's checkpoints do not form one chain: two roots, or a checkpoint with two children
==================  ===================================================================================

What holds them (:class:`agentlab.core.safeguards.Safeguards`): the per-run thread lease (``run_lock``)
for ``same_thread_runs``; natural keys (``constraints``: UNIQUE customer + reference) for
``double_submit`` (the refund story itself is no good double-submit case under ``full``: its
``ApplyCredit`` is a bare deduction with no natural key, and a model that resends it after the twin's
memo conflict deducts twice, see case C23); a row lock in the check-then-act tool (``row_locks``) or ``repeatable read``
(the late writer fails with 40001 and the graph retries it) for ``lost_update`` and ``check_then_act``;
the row lock or ``serializable`` for ``write_skew`` (repeatable read lets it through). ``full`` holds all.

On the retail domain (``chaos --domain retail``) the same faults play retail's own races on rows each
episode makes for itself, met at the tools' first writes, and checked by the retail invariants
(:mod:`agentlab.domains.retail.concurrency`), which the domain hands the lab as ``Domain.races``
(:class:`agentlab.core.races.Races`, played by :func:`run_domain_races`); ``write_skew`` does not apply there
and :func:`domain_races` refuses it with the reason.

Sources: PostgreSQL docs "Transaction Isolation", "Explicit Locking", "Serializable Snapshot Isolation"
(wiki SSI; Ports and Grittner, VLDB 2012), ``pg_blocking_pids``; Kingsbury, Jepsen analyses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import HumanMessage
from psycopg import sql

from agentlab.core.domain import Violation
from agentlab.core.graph import RETRY_ATTEMPTS, build_graph, run_config
from agentlab.core.run_lock import ThreadBusy, thread_lease
from agentlab.core.scenario import Scenario
from agentlab.domains.billing.limits import DAILY_REFUND_CAP_CENTS
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

# --------------------------------------------------------------------------- invariants

CONCURRENCY_RECORDS = """
SELECT c.id, c.credit_cents,
       (SELECT coalesce(sum(r.amount_cents), 0) FROM limits.credit_redemptions r WHERE r.customer_id = c.id),
       (SELECT count(*) FROM limits.credit_redemptions r WHERE r.customer_id = c.id),
       (SELECT coalesce(json_agg(r.reference), '[]') FROM {s}.refunds r WHERE r.customer_id = c.id),
       (SELECT coalesce(json_agg(m.reference), '[]') FROM {s}.credit_memos m WHERE m.customer_id = c.id),
       (SELECT coalesce(max(d.total), 0) FROM (SELECT sum(r.amount_cents) AS total FROM {s}.refunds r
                                               WHERE r.customer_id = c.id GROUP BY r.created_at::date) d),
       (SELECT coalesce(json_agg(p.reference), '[]') FROM provider.payments p
         WHERE p.customer = %(prefix)s || c.id AND p.kind = 'refund')
FROM {s}.customers c WHERE c.id = ANY(%(ids)s)
"""
CHECKPOINT_SHAPE = """
SELECT count(*) FILTER (WHERE parent_checkpoint_id IS NULL),
       coalesce(max(n), 0)
FROM (SELECT parent_checkpoint_id, count(*) OVER (PARTITION BY parent_checkpoint_id) AS n
      FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '') AS c
"""


async def check_concurrency(pool, schema: str, customer_ids: list[int], opening_cents: dict[int, int],
                            thread_ids: list[str]) -> list[Violation]:
    """The invariants of :data:`KINDS` for customers ``customer_ids`` in ``schema`` and threads ``thread_ids``,
    read from the business tables, the provider's payments and the checkpoints.

    ``opening_cents``: each customer's opening credit (cents), from the scenario."""
    from agentlab.sim.provider import customer_ref

    prefix = customer_ref(0)[:-1]  # the provider names customer 7 "cus_7"
    query = sql.SQL(CONCURRENCY_RECORDS).format(s=sql.Identifier(schema))
    tid = thread_ids[0]
    out: list[Violation] = []
    async with pool.connection() as conn:
        rows = await (await conn.execute(query, {"ids": customer_ids, "prefix": prefix})).fetchall()
        shapes = [(t, *(await (await conn.execute(CHECKPOINT_SHAPE, (t,))).fetchone())) for t in dict.fromkeys(thread_ids)]
    for cid, credit, redeemed, n_redeemed, refunds, memos, day_max, paid in rows:
        for what, refs in (("refunds", refunds), ("credit memos", memos), ("provider refunds", paid)):
            for ref, n in Counter(refs).items():
                if n > 1:
                    out.append(Violation("paid_twice", tid, f"customer {cid}: {n} {what} for reference {ref}"))
        opening = opening_cents.get(cid)
        if n_redeemed and opening is not None and credit != opening - redeemed:
            out.append(Violation("lost_update", tid, f"customer {cid}: balance {credit} cents, opening {opening} minus "
                                                     f"{n_redeemed} redemption(s) of {redeemed} is {opening - redeemed}"))
        if opening is not None and redeemed > opening:
            out.append(Violation("cap_exceeded", tid, f"customer {cid}: {redeemed} cents redeemed of {opening}"))
        if day_max > DAILY_REFUND_CAP_CENTS:
            out.append(Violation("cap_exceeded", tid, f"customer {cid}: {day_max} cents refunded in one day, "
                                                      f"cap {DAILY_REFUND_CAP_CENTS}"))
    for thread, roots, children in shapes:
        if roots > 1 or children > 1:
            out.append(Violation("forked_thread", thread, f"{roots} root checkpoints, at most {children} children "
                                                          "of one checkpoint"))
    return out


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
    """Run and check one episode of ``fault`` on ``lab`` (an :class:`agentlab.lab.runner.Lab`): the two
    conversations at once, the outbox drained, the invariants of the billing checker plus :data:`KINDS`.
    Returns ``(episode, end state scenario, notes, violations)``; the runner makes its FaultRun of them.
    ``notes`` holds ``rendezvous`` (what the barrier did), ``refused`` (conversations the thread lease
    refused), ``errors`` and ``threads``. A domain with races of its own (``domain.races``; retail's:
    :data:`agentlab.domains.retail.concurrency.CONCURRENCY`) plays them instead (:func:`run_domain_races`)."""
    from agentlab.lab.invariants import check_messages, check_state, read_records

    h, process = lab.harness, lab.process
    if h.domain is not None and h.domain.races is not None:
        return await run_domain_races(lab, fault, sg, race=scenario, seed=seed, check=check, model=model)
    base = fault.prepare(h.scenario(scenario).clean(), rng)
    sc_a, sc_b = fault.scenarios_for(base)
    t0 = time.perf_counter()
    thread = f"{fault.name}-{sg.name}-{uuid.uuid4().hex[:12]}"
    async with process.pool.connection() as conn:
        ids = await h.domain.create_rows(conn, sc_a, sg.schema)
    convs = [Conversation("A", thread, sc_a, seed),
             Conversation("B", thread if fault.same_thread else f"{thread}-b", sc_b, seed + 1)]
    gate = Rendezvous(h.pool, ("A", "B"), meets_at(*fault.acts))
    intended = fault.end_state(sc_a)

    async def checker(ep, threads: list[str], histories: dict[str, list]) -> list[Violation]:
        records, ledger = await read_records(h.pool, sg.schema, ids, thread)
        for t in threads[1:]:
            ledger |= (await read_records(h.pool, sg.schema, ids, t))[1]
        # the state and what both were told, on the union; the message checks on each thread's own history
        found = [v for v in check_state(ep, intended, sg, records, ledger if sg.ledger else None)
                 if v.kind not in MESSAGE_CHECKS]
        for t in threads:
            found += check_messages(histories[t], t, sg)
        opening = {cid: spec.credit_cents for cid, spec in zip(ids, sc_a.customers)}
        return found + await check_concurrency(h.pool, sg.schema, ids, opening, threads)

    ep, threads, _, violations = await _play_pair(lab, sg, convs, gate, ids, model, thread, fault,
                                                  checker if check else None)
    errors = [f"{c.name}: {c.error}" for c in convs if c.error]
    ep.wall_ms = (time.perf_counter() - t0) * 1000
    notes: dict[str, Any] = {"rendezvous": gate.account(), "refused": [c.name for c in convs if c.refused],
                             "errors": errors, "threads": threads}
    return ep, intended, notes, violations


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


# --------------------------------------------------------------------------- a domain's own races (retail's)

async def run_domain_races(lab, fault: Concurrent, sg, *, race: str, seed: int, check: bool = True, model=None):
    """One episode of ``fault`` on a domain with races of its own (``domain.races``, :class:`agentlab.core.races.Races`;
    retail's: :data:`agentlab.domains.retail.concurrency.CONCURRENCY`): rows of its own (``races.create``), race
    ``race`` played by two conversations met at ``races.acts``, checked by :func:`check_generic` on each thread,
    the races' invariants (``races.check``) and ``forked_thread``. Returns what :func:`run_concurrent` returns;
    ``notes`` also holds ``race`` and what ``races.notes`` shows of the rows (retail: ``user_id``)."""
    from agentlab.lab.invariants import check_generic

    h = lab.harness
    races = h.domain.races
    t0 = time.perf_counter()
    async with h.pool.connection() as conn:
        rows = await races.create(conn)
    sc_a, sc_b = races.scenarios(race, rows)
    thread = f"{fault.name}-{sg.name}-{uuid.uuid4().hex[:12]}"
    convs = [Conversation("A", thread, sc_a, seed),
             Conversation("B", thread if fault.same_thread else f"{thread}-b", sc_b, seed + 1)]
    gate = Rendezvous(h.pool, ("A", "B"), meets_at(*races.acts))

    async def checker(ep, threads: list[str], histories: dict[str, list]) -> list[Violation]:
        found: list[Violation] = []
        for t in threads:
            one = dataclasses.replace(ep, thread_id=t, messages=histories[t])
            found += await check_generic(h.pool, one, sg, h.domain.error_hints.identifiers)
        async with h.pool.connection() as conn:
            found += [Violation(kind, thread, detail) for kind, detail in await races.check(conn, rows)]
            for t in threads:
                roots, children = await (await conn.execute(CHECKPOINT_SHAPE, (t,))).fetchone()
                if roots > 1 or children > 1:
                    found.append(Violation("forked_thread", t, f"{roots} root checkpoints, at most {children} "
                                                              "children of one checkpoint"))
        return found

    ep, threads, _, violations = await _play_pair(lab, sg, convs, gate, [], model, thread, fault,
                                                  checker if check else None)
    errors = [f"{c.name}: {c.error}" for c in convs if c.error]
    ep.wall_ms = (time.perf_counter() - t0) * 1000
    notes: dict[str, Any] = {"rendezvous": gate.account(), "refused": [c.name for c in convs if c.refused],
                             "errors": errors, "threads": threads, "race": race,
                             **(races.notes(rows) if races.notes is not None else {})}
    return ep, sc_a, notes, violations


run_retail_concurrent = run_domain_races  # the name this had while retail's races were imported by name


MESSAGE_CHECKS = ("unanswered_call", "leak", "half_applied_batch")
