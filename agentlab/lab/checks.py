"""Checks for a learner's own code: an invariant run on a clean episode and on a broken one.

``await check_invariant(fn, domain, fault="backend_killed", preset="ledger")`` runs two fresh episodes of
``domain`` in a database of their own: one under ``full`` with no fault (``fn`` must report nothing) and
one under ``preset`` with ``fault`` (``fn`` must report something). It prints each as passed or failed,
with a hint, and returns whether both passed. :func:`invariant_line_counts` gives the two counts behind
the verdicts (notebook 16's exercise 16.1 checks with them); :func:`invariant_line_count_after` the count
on a clean episode whose rows a check changed on purpose, for a mistake no fault makes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agentlab.core.domain import InvariantContext
from agentlab.lab.runner import Lab
from agentlab.runtime.harness import Harness

CLEAN_HINT = ("it reported a violation where everything holds: read the rows of ctx.ids only, and compare "
              "with what the scenario meant")
BROKEN_HINT = ("it reported nothing where the provider's records and the database disagree: count the "
               "payments per payout, not per account")


async def _details(fn, h: Harness, run) -> list[str]:
    ep = run.episode
    async with h.pool.connection() as conn:
        ctx = InvariantContext(conn, ep.thread_id, list(ep.customer_ids), ep.schema, run.scenario, list(ep.messages))
        return list(await fn(ctx))


async def invariant_line_counts(fn, domain, *, fault: str, preset: str, seed: int = 0) -> tuple[int, int]:
    """Run invariant ``fn`` (``async fn(ctx) -> list[str]``) on a clean ``full`` episode of ``domain`` and on
    one under ``fault`` and ``preset``, in a fresh database of their own; return how many lines ``fn``
    reported for each, ``(clean, broken)``: a good invariant gives ``(0, at least 1)``.

    Raises:
        ValueError: ``fault`` does not fit ``domain`` or ``preset`` is unknown.
    """
    async with await Harness.open(purpose="check", domain=domain) as h, Lab(h) as lab:
        clean = await lab.run("none", "full", seed=seed, check=False)
        broken = await lab.run(fault, preset, seed=seed, check=False)
        return len(await _details(fn, h, clean)), len(await _details(fn, h, broken))


async def invariant_line_count_after(fn, domain, tamper: Callable[..., Awaitable[None]], *, seed: int = 0) -> int:
    """Run invariant ``fn`` on a clean ``full`` episode of ``domain`` after ``await tamper(conn, ids)`` changed
    its rows (``conn`` an autocommit connection of the episode's database, ``ids`` the episode's customer
    ids), in a fresh database of its own; return how many lines ``fn`` reported.

    Raises:
        ValueError: ``domain`` has no clean ``full`` episode to play.
    """
    async with await Harness.open(purpose="check", domain=domain) as h, Lab(h) as lab:
        run = await lab.run("none", "full", seed=seed, check=False)
        async with h.pool.connection() as conn:
            await tamper(conn, list(run.episode.customer_ids))
        return len(await _details(fn, h, run))


async def check_invariant(fn, domain, *, fault: str, preset: str, seed: int = 0) -> bool:
    """Run invariant ``fn`` (``async fn(ctx) -> list[str]``) on a clean ``full`` episode of ``domain`` and
    on one under ``fault`` and ``preset``; print the two verdicts; True when both pass.

    Raises:
        ValueError: ``fault`` does not fit ``domain`` or ``preset`` is unknown.
    """
    clean, broken = await invariant_line_counts(fn, domain, fault=fault, preset=preset, seed=seed)
    ok = True
    for title, lines, passed, hint in (("a clean episode under full reports nothing", clean, clean == 0, CLEAN_HINT),
                                       (f"{fault} under {preset} is reported", broken, broken > 0, BROKEN_HINT)):
        ok &= passed
        print(f"{'passed' if passed else 'FAILED'}: {title} ({lines} line(s))" + ("" if passed else f"; hint: {hint}"))
    return ok
