"""Two conversations at once on one customer (the concurrency family): their interleaving is forced by a
rendezvous between real transactions (:mod:`agentlab.lab.concurrency`).

Part of the fault catalog (:mod:`agentlab.lab.faults`, its registry and table).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agentlab.domains.billing.limits import WRITE_CREDIT
from agentlab.domains.billing.scenarios import C, Intended, PlannedCall, Scenario
from agentlab.domains.billing.tools import CREATE_REFUND
from agentlab.lab.nemesis.base import Fault

RENDEZVOUS_S = 5.0  # a conversation waits at most this long for the other at its act (agentlab.lab.concurrency);
# each wait ends early in the usual case (the other arrived, ended, or waits on this one's lock), so the bound only
# matters under load: 1 s let a chaos run of 32 episodes at once time out and change its table between runs


@dataclass(frozen=True)
class Concurrent(Fault):
    """Two conversations at once on one customer; :mod:`agentlab.lab.concurrency` runs and checks them.

    Attributes:
        first, second: the planned calls of conversations A and B (None: the scenario's), ``C(i)`` naming
            the customers of the scenario (both conversations act on the same rows).
        same_thread: both conversations run on one thread.
        intended: the end state both conversations together mean to reach (None: the scenario's own).
        acts: the statements the conversations meet at.
    """

    first: tuple[tuple[PlannedCall, ...], ...] | None = None
    second: tuple[tuple[PlannedCall, ...], ...] | None = None
    same_thread: bool = False
    intended: Intended | None = None
    acts: tuple[str, ...] = ()
    conversations = 2

    def scenarios_for(self, scenario: Scenario) -> tuple[Scenario, Scenario]:
        """Conversation A's and B's scenarios (their steps replaced by :attr:`first`, :attr:`second`). Pure."""
        a = scenario if self.first is None else dataclasses.replace(scenario, steps=self.first)
        b = scenario if self.second is None else dataclasses.replace(scenario, steps=self.second)
        return a, b

    def end_state(self, scenario: Scenario) -> Scenario:
        """``scenario`` with the end state both conversations together should reach."""
        return scenario if self.intended is None else dataclasses.replace(scenario, intended=self.intended)


def _redeem(amount: int) -> tuple[tuple[PlannedCall, ...], ...]:
    return ((PlannedCall("RedeemCredit", {"customer_id": C(0), "amount_cents": amount}),),)


def _capped(reference: str, amount: int) -> tuple[tuple[PlannedCall, ...], ...]:
    return ((PlannedCall("RefundWithinCap", {"customer_id": C(0), "reference": reference, "amount_cents": amount}),),)


_NO_RECORDS = {"invoices": (0,), "credit_memos": (0,), "provider_charges": (0,)}

CONCURRENCY_FAULTS: dict[str, Concurrent] = {f.name: f for f in (
    Concurrent("same_thread_runs", "concurrency", "one request submitted twice at once on one thread (C18)",
               "run_lock (one writer per thread for a whole run)", ("redeem",), same_thread=True,
               first=_redeem(2000), second=_redeem(2000),
               intended=Intended(final_credit_cents=(3000,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS),
               acts=(WRITE_CREDIT,)),
    Concurrent("double_submit", "concurrency", "one refund request submitted twice at once, on two threads",
               "constraints (the natural key: customer and reference)", ("capped_refund",),
               first=_capped("RMA-2001", 2000), second=_capped("RMA-2001", 2000),
               intended=Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), **_NO_RECORDS),
               acts=(CREATE_REFUND,)),
    Concurrent("lost_update", "concurrency", "two redemptions read the same balance and write their own result",
               "row_locks or repeatable read", ("redeem",), first=_redeem(2000), second=_redeem(1500),
               intended=Intended(final_credit_cents=(1500,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS),
               acts=(WRITE_CREDIT,)),
    Concurrent("check_then_act", "concurrency", "two redemptions each pass the balance check, together they exceed it",
               "row_locks or repeatable read", ("redeem",), first=_redeem(3000), second=_redeem(3000),
               intended=Intended(final_credit_cents=(2000,), refunds=(0,), provider_refunds=(0,), **_NO_RECORDS),
               acts=(WRITE_CREDIT,)),
    Concurrent("write_skew", "concurrency", "two refunds each pass the daily cap check, together they exceed it",
               "row_locks or serializable", ("capped_refund",), first=_capped("RMA-2001", 3000),
               second=_capped("RMA-2002", 3000),
               intended=Intended(final_credit_cents=(0,), refunds=(1,), provider_refunds=(1,), **_NO_RECORDS),
               acts=(CREATE_REFUND,)),
)}
CONCURRENCY_FAMILY = tuple(CONCURRENCY_FAULTS)
"""Faults of real concurrency (:mod:`agentlab.lab.concurrency`): two conversations at once on one customer.
Selectable by name (``chaos --faults ...``); not in :data:`FAULTS`, the default table's rows."""
