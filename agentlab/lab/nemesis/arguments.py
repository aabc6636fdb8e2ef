"""Hallucinated arguments and constraint breaks: faults the scripted model really emits (each one's ``fix`` is
what a careful model sends once told which argument is wrong).

Part of the fault catalog (:mod:`agentlab.lab.faults`, its registry and table).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentlab.core.scenario import C, PlannedCall, Scenario
from agentlab.lab.nemesis.base import Fault


@dataclass(frozen=True)
class Hallucination(Fault):
    """One planned call of ``tool`` gets a bad value for ``field``; ``fix`` is the original call."""

    tool: str = "ApplyCredit"
    field: str = "amount_cents"
    corrupt: Callable[[Any, Scenario], Any] | None = None
    later_only: bool = False  # only calls after the first of their step (so siblings ran before them)

    def targets(self, scenario: Scenario) -> list[tuple[int, int, PlannedCall]]:
        return [(s, k, c) for s, k, c in scenario.calls()
                if (self.tool == "*" or c.tool == self.tool) and self.field in c.args and (k > 0 or not self.later_only)]

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        step, index, call = rng.choice(self.targets(scenario))
        bad = dict(call.args)
        bad[self.field] = self.corrupt(call.args[self.field], scenario)
        return scenario.with_call(step, index, args=bad, fix=dict(call.args))


def major_units(cents: int, scenario: Scenario) -> float:
    return cents / 100  # 2500 cents sent as 25.0: a decimal in the currency's major unit


def negated(cents: int, scenario: Scenario) -> int:
    return -cents


def with_stray_quote(customer: C, scenario: Scenario) -> C:
    return C(customer.index, quote=True)


@dataclass(frozen=True)
class OtherTenant(Hallucination):
    """The model names a customer of another tenant: one the episode creates, so no episode shares it
    (:func:`agentlab.lab.tenancy.with_foreign_customer`); told "not found", it sends the right customer."""

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        from agentlab.lab.tenancy import with_foreign_customer

        step, index, _ = rng.choice(self.targets(scenario))
        return with_foreign_customer(scenario, step, index)


@dataclass(frozen=True)
class OverBalance(Hallucination):
    """The model deducts more than the customer's credit: the CHECK on the balance is what refuses it."""

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        step, index, call = rng.choice(self.targets(scenario))
        opening = scenario.customers[call.args["customer_id"].index].credit_cents
        return scenario.with_call(step, index, args={**call.args, "amount_cents": opening + 1000}, fix=dict(call.args))


@dataclass(frozen=True)
class MissingInvoice(Hallucination):
    """The model attaches a credit memo to an invoice id it made up (the FOREIGN KEY refuses it)."""

    tool: str = "CreateCreditMemo"
    field: str = "customer_id"

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        step, index, call = rng.choice(self.targets(scenario))
        invented = 7_000_000_000 + rng.randrange(1_000_000)  # no invoice has such an id
        return scenario.with_call(step, index, args={**call.args, "invoice_id": invented}, fix=dict(call.args))


@dataclass(frozen=True)
class RepeatNaturalKey(Fault):
    """After its work, the model creates one record again under the same natural key, as an LLM does
    when it is not sure the first call went through."""

    tools: tuple[str, ...] = ("CreateInvoice", "CreateCreditMemo")

    def prepare(self, scenario: Scenario, rng: random.Random) -> Scenario:
        _, _, call = rng.choice([t for t in scenario.calls() if t[2].tool in self.tools])
        return scenario.with_step((PlannedCall(call.tool, dict(call.args)),))


@dataclass(frozen=True)
class ScenarioFault(Fault):
    """The fault is the scenario itself (dependent calls sent in the wrong order)."""
