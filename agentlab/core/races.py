"""A domain's own races: the concurrency family's two conversations, as the domain plays them on rows of its own.

The lab's concurrency family (``same_thread_runs``, ``double_submit``, ``lost_update``, ``check_then_act``,
``write_skew``: :mod:`agentlab.lab.concurrency`) runs two conversations at once and forces their interleaving
at the statements they meet at. A domain whose tools invite other races states them as a :class:`Races` value
in ``Domain.races`` (retail: :data:`agentlab.domains.retail.concurrency.CONCURRENCY`); the lab plays them
through it and never asks for the domain by name. A domain without one plays the family's default races,
billing's, on its scenarios.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Races:
    """What a domain brings to the concurrency family.

    Attributes:
        by_fault: for each fault of the family that fits the domain, the names of its races (an episode plays
            one, chosen by its seed).
        create: ``await create(conn) -> rows``: one episode's own rows (``conn``: an autocommit connection of the
            kit's role), so episodes running at once never share one.
        scenarios: ``scenarios(race, rows) -> (A's scenario, B's scenario)``.
        check: ``await check(conn, rows) -> [(kind, detail)]``: the race's invariants on the episode's rows, read
            from the database (empty: they hold).
        acts: the statements the two conversations meet at (:func:`agentlab.lab.rendezvous.meets_at`).
        not_applicable: a fault of the family that does not fit the domain, and why (one line).
        kinds: the kinds ``check`` reports.
        notes: ``notes(rows) -> dict``: what the episode's notes show of its rows (a user's id, say); None:
            nothing.
    """

    by_fault: Mapping[str, tuple[str, ...]]
    create: Callable[[Any], Awaitable[Any]]
    scenarios: Callable[[str, Any], tuple[Any, Any]]
    check: Callable[[Any, Any], Awaitable[list[tuple[str, str]]]]
    acts: tuple[str, ...] = ()
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    kinds: tuple[str, ...] = ()
    notes: Callable[[Any], dict] | None = None

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
