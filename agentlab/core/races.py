"""A domain's own races: the concurrency family's two conversations, as the domain plays them on rows of its own.

The lab's concurrency family (``same_thread_runs``, ``double_submit``, ``lost_update``, ``check_then_act``,
``write_skew``: :mod:`agentlab.lab.concurrency`) runs two conversations at once and forces their interleaving
at the statements they meet at. A domain states its races as a :class:`Races` value in ``Domain.races``
(billing: :data:`agentlab.domains.billing.concurrency.CONCURRENCY`; retail:
:data:`agentlab.domains.retail.concurrency.CONCURRENCY`); the lab plays every domain's through it, with one
runner, and never asks for the domain by name. A domain without one has no race to play: the family does not
apply to it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RaceEpisode:
    """What the lab tells a domain's :attr:`Races.create` about the episode it makes rows for.

    Attributes:
        fault: the name of the family's fault the episode plays (``"lost_update"``, say).
        race: the race's name, one of ``Races.by_fault[fault]``.
        schema: the PostgreSQL schema the episode's tools write to (the preset's: ``"public"``, or billing's
            ``"lax"`` when its constraints are off).
    """

    fault: str
    race: str
    schema: str


@dataclass(frozen=True)
class Races:
    """What a domain brings to the concurrency family.

    Attributes:
        by_fault: for each fault of the family that fits the domain, the names of its races (an episode plays
            one, chosen by its seed).
        create: ``await create(conn, episode) -> rows``: one episode's own rows (``conn``: an autocommit connection
            of the kit's role; ``episode``: a :class:`RaceEpisode`), so episodes running at once never share one.
        scenarios: ``scenarios(race, rows) -> (A's scenario, B's scenario)``. A's ``intended`` is the end state
            both conversations together mean to reach (the lab returns A's scenario as the run's end state).
        check: ``await check(conn, rows) -> [(kind, detail)]``: the race's invariants on the episode's rows, read
            from the database (empty: they hold).
        acts: the statements the two conversations meet at (:func:`agentlab.lab.rendezvous.meets_at`).
        not_applicable: a fault of the family that does not fit the domain, and why (one line).
        kinds: the kinds ``check`` reports.
        notes: ``notes(rows) -> dict``: what the episode's notes show of its rows (a user's id, say); None:
            nothing.
        ids: ``ids(rows) -> [int]``: the ids of the rows the scenarios' ``C(i)`` name, in order (the episode's
            ``customer_ids``); None: the scenarios name none.
        union: how the lab judges the two conversations besides ``check``. True: as one episode, on the union of
            both threads' effects: the domain's own invariants (``Domain.invariants``, against A's ``intended``)
            and the ledger on both threads' messages at once, the message checks on each thread's own history.
            False: the generic checks (messages, ledger, payments) on each thread apart, the domain's own
            invariants not run (``check`` judges the episode's rows).
    """

    by_fault: Mapping[str, tuple[str, ...]]
    create: Callable[[Any, RaceEpisode], Awaitable[Any]]
    scenarios: Callable[[str, Any], tuple[Any, Any]]
    check: Callable[[Any, Any], Awaitable[list[tuple[str, str]]]]
    acts: tuple[str, ...] = ()
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    kinds: tuple[str, ...] = ()
    notes: Callable[[Any], dict] | None = None
    ids: Callable[[Any], list[int]] | None = None
    union: bool = False

    def names(self, fault: str, domain: str = "the domain") -> tuple[str, ...]:
        """The races of ``fault`` (a fault of the family). Raises ValueError naming why when it does not
        apply to ``domain`` (a name, for the message), or when the domain has no race for it."""
        if fault in self.not_applicable:
            raise ValueError(f"fault {fault!r} does not apply to domain {domain!r}: {self.not_applicable[fault]}")
        try:
            return tuple(self.by_fault[fault])
        except KeyError:
            raise ValueError(f"domain {domain!r} has no race for fault {fault!r}; its races are for "
                             f"{', '.join(self.by_fault)}") from None


# --------------------------------------------------------------------------- the family's generic invariant

CHECKPOINT_SHAPE = """
SELECT count(*) FILTER (WHERE parent_checkpoint_id IS NULL),
       coalesce(max(n), 0)
FROM (SELECT parent_checkpoint_id, count(*) OVER (PARTITION BY parent_checkpoint_id) AS n
      FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '') AS c
"""


async def forked_threads(conn, thread_ids: list[str]) -> list[tuple[str, str]]:
    """``forked_thread`` on each of ``thread_ids`` (duplicates read once), read on ``conn`` from LangGraph's
    ``checkpoints`` table: ``[(thread id, detail)]`` for each thread whose checkpoints do not form one chain (two
    roots, or a checkpoint with two children); empty when every thread's do."""
    out: list[tuple[str, str]] = []
    for thread in dict.fromkeys(thread_ids):
        roots, children = await (await conn.execute(CHECKPOINT_SHAPE, (thread,))).fetchone()
        if roots > 1 or children > 1:
            out.append((thread, f"{roots} root checkpoints, at most {children} children of one checkpoint"))
    return out
