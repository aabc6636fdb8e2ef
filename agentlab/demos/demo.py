"""``python -m agentlab demo``: the seed's stories, end to end, told step by step.

``refund`` (default): in one step the model sends CreateCreditMemo, ApplyCredit and QueueRefund, the
third with the customer id as text with a stray quote. Under ``full`` the batch is refused before any
SQL (one FAILED naming the field, two NOT APPLIED), the model corrects and resends, the batch
commits, the outbox worker refunds once. Under ``naive`` the first two commit, the third fails with
a raw error, the model resends all three: two credit memos and a double deduction.

``invoice``: CreateInvoice, ApplyCredit over the balance (breaks the CHECK), QueueCharge; the batch is
rolled back, the model applies the available credit instead, the batch commits, one charge.

Another domain (``--domain retail``, ``--domain examples.payouts:DOMAIN``) plays one of its own scenarios
(:func:`run_domain_demo`) and reports the steps, the outbox and its invariants, generic and its own.
"""

from __future__ import annotations

import time
from typing import Any

from agentlab.core.domain import Domain
from agentlab.core.errors import DomainError
from agentlab.core.outbox import outbox_counts
from agentlab.core.safeguards import preset
from agentlab.demos.report import (
    domain_report,
    episode_report,
    render_domain_episode,
    render_episode,
    to_json,
)
from agentlab.domains.billing.scenarios import get_scenario
from agentlab.runtime.domains import resolve_domain
from agentlab.runtime.harness import Harness

__all__ = ["episode_report", "render", "render_episode", "run_demo", "run_domain_demo", "to_json"]


async def run_demo(scenario: str = "refund", preset_name: str = "full", *, seed: int = 0,
                   keep: bool = False, model=None) -> dict[str, Any]:
    """Run one demo episode in a fresh database; return the report (see :func:`report`).
    ``saga`` and ``approval`` run :mod:`agentlab.demos.workflows` instead (scripted only).
    ``model``: a chat model to play instead of the scripted one (:func:`agentlab.runtime.models.load_model`).

    Raises:
        ValueError: a ``model`` with the ``saga`` or ``approval`` demo (their steps are scripted)."""
    if scenario in ("saga", "approval"):
        if model is not None:
            raise ValueError(f"the {scenario} demo plays scripted steps; run it without a model")
        from agentlab.demos.workflows import run_workflow_demo

        return await run_workflow_demo(scenario, preset_name, seed=seed, keep=keep)
    sc = get_scenario(scenario)
    sg = preset(preset_name)
    t0 = time.perf_counter()
    h = await Harness.open(purpose="demo", keep=keep)
    try:
        ep = await h.run_episode(sc, sg, seed=seed, model=model)
        rep = await episode_report(h, ep)
    finally:
        await h.close()
    rep["wall_s"] = round(time.perf_counter() - t0, 3)
    rep["database"] = h.url if keep else None
    return rep


async def run_domain_demo(domain: Domain | str, scenario: str | None = None, preset_name: str = "full", *,
                          seed: int = 0, keep: bool = False) -> dict[str, Any]:
    """Play ``scenario`` of ``domain`` (default its first) in a fresh database of the domain, drain the
    outbox and check the invariants; return the :func:`agentlab.demos.report.domain_report`.

    Raises:
        DomainError: the domain cannot be found, or has no scenario to play.
        ValueError: the domain has no scenario named ``scenario`` (the message names its scenarios).
    """
    from agentlab.lab.invariants import check_episode

    domain = resolve_domain(domain)
    if not domain.scenarios:
        raise DomainError(f"domain {domain.name!r} has no scenarios: a demo plays one of the domain's own "
                          "(give it Domain(scenarios={name: Scenario(...)}))")
    sc = domain.get_scenario(scenario) if scenario else next(iter(domain.scenarios.values()))
    sg = preset(preset_name)
    t0 = time.perf_counter()
    h = await Harness.open(purpose="demo", keep=keep, domain=domain)
    try:
        ep = await h.run_episode(sc, sg, seed=seed)
        violations = await check_episode(h.pool, ep, sc, sg, domain)
        rep = domain_report(ep, domain.name, violations, await outbox_counts(h.pool), wall_s=0.0,
                            database=h.url if keep else None)
    finally:
        await h.close()
    rep["wall_s"] = round(time.perf_counter() - t0, 3)
    return rep


def render(rep: dict, *, timing: bool = True) -> str:
    """The human-readable account of a demo report (``timing=False`` leaves out the wall time)."""
    if "domain" in rep:
        return render_domain_episode(rep, timing=timing)
    if "runs" in rep or "approval" in rep:  # the saga and approval demos (agentlab.demos.workflows)
        from agentlab.demos.workflows import render_workflow

        return render_workflow(rep)
    return render_episode(rep, timing=timing)
