"""Two conversations at once on the same rows (the concurrency family): their interleaving is forced by a
rendezvous between real transactions (:mod:`agentlab.lab.concurrency`). What the two do is the domain's: its
races (``Domain.races``, :class:`agentlab.core.races.Races`; billing's: :mod:`agentlab.domains.billing.concurrency`).

Part of the fault catalog (:mod:`agentlab.lab.faults`, its registry and table).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentlab.lab.nemesis.base import Fault

RENDEZVOUS_S = 5.0  # a conversation waits at most this long for the other at its act (agentlab.lab.concurrency);
# each wait ends early in the usual case (the other arrived, ended, or waits on this one's lock), so the bound only
# matters under load: 1 s let a chaos run of 32 episodes at once time out and change its table between runs


@dataclass(frozen=True)
class Concurrent(Fault):
    """Two conversations at once on the same rows; :mod:`agentlab.lab.concurrency` runs and checks them, playing
    the domain's races for the fault (``Domain.races``): their rows, calls, end state and meeting statements.

    Attributes:
        same_thread: both conversations run on one thread.
    """

    scenarios: tuple[str, ...] = ()  # the domain's races name them (Races.by_fault)
    same_thread: bool = False
    conversations = 2


CONCURRENCY_FAULTS: dict[str, Concurrent] = {f.name: f for f in (
    Concurrent("same_thread_runs", "concurrency", "one request submitted twice at once on one thread (C18)",
               "run_lock (one writer per thread for a whole run)", same_thread=True),
    Concurrent("double_submit", "concurrency", "one refund request submitted twice at once, on two threads",
               "constraints (the natural key: customer and reference)"),
    Concurrent("lost_update", "concurrency", "two redemptions read the same balance and write their own result",
               "row_locks or repeatable read"),
    Concurrent("check_then_act", "concurrency", "two redemptions each pass the balance check, together they exceed it",
               "row_locks or repeatable read"),
    Concurrent("write_skew", "concurrency", "two refunds each pass the daily cap check, together they exceed it",
               "row_locks or serializable"),
)}
CONCURRENCY_FAMILY = tuple(CONCURRENCY_FAULTS)
"""Faults of real concurrency (:mod:`agentlab.lab.concurrency`): two conversations at once on the same rows.
Selectable by name (``chaos --faults ...``); not in :data:`FAULTS`, the default table's rows."""
