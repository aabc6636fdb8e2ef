"""Checks for a learner's own code: an invariant run on a clean episode and on a broken one.

``await check_invariant(fn, domain, fault="backend_killed", preset="ledger")`` runs two fresh episodes of
``domain`` in a database of their own: one under ``full`` with no fault (``fn`` must report nothing) and
one under ``preset`` with ``fault`` (``fn`` must report something). It prints each as passed or failed,
with a hint, and returns whether both passed.
"""

from __future__ import annotations

from agentlab.core.domain import InvariantContext
from agentlab.lab.runner import Lab
from agentlab.runtime.harness import Harness


async def _details(fn, h: Harness, run) -> list[str]:
    ep = run.episode
    async with h.pool.connection() as conn:
        ctx = InvariantContext(conn, ep.thread_id, list(ep.customer_ids), ep.schema, run.scenario, list(ep.messages))
        return list(await fn(ctx))


async def check_invariant(fn, domain, *, fault: str, preset: str, seed: int = 0) -> bool:
    """Run invariant ``fn`` (``async fn(ctx) -> list[str]``) on a clean ``full`` episode of ``domain`` and
    on one under ``fault`` and ``preset``; print the two verdicts; True when both pass.

    Raises:
        ValueError: ``fault`` does not fit ``domain`` or ``preset`` is unknown.
    """
    async with await Harness.open(purpose="check", domain=domain) as h, Lab(h) as lab:
        clean = await lab.run("none", "full", seed=seed, check=False)
        broken = await lab.run(fault, preset, seed=seed, check=False)
        verdicts = [
            ("a clean episode under full reports nothing", await _details(fn, h, clean), False,
             "it reported a violation where everything holds: read the rows of ctx.ids only, and compare "
             "with what the scenario meant"),
            (f"{fault} under {preset} is reported", await _details(fn, h, broken), True,
             "it reported nothing where the provider's records and the database disagree: count the "
             "payments per payout, not per account"),
        ]
    ok = True
    for title, details, want_some, hint in verdicts:
        passed = bool(details) == want_some
        ok &= passed
        print(f"{'passed' if passed else 'FAILED'}: {title} ({len(details)} line(s))" + ("" if passed else f"; hint: {hint}"))
    return ok
