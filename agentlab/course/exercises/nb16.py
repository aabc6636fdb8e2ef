"""Exercises of notebook 16 (bring your own tool): your own invariant."""

from __future__ import annotations

from agentlab.course.exercises import Exercise, Verdict

PER_PAYOUT_HINT = ("it reported nothing where payout INV-1 was paid twice and INV-2 never: the account's totals agree "
                   "(2 payouts, 2 payments), so counting payments per account cannot see it; count the payments per "
                   "payout, under its own reference payout:<account_id>:<reference>")
HARNESS_HINT = ("the invariant gets ctx, not a harness: run your SQL on ctx.conn (cur = await ctx.conn.execute(sql, "
                "params)) for the accounts in ctx.ids; % in a LIKE pattern is %%")
DOMAIN_HINT = "pass the notebook's domain: await check('16.1', no_payout_without_its_intent, domain=PAYOUTS)"
SWAP_PAYMENT = """
UPDATE provider.payments SET reference = 'payout:' || %(account)s || ':INV-1'
WHERE reference = 'payout:' || %(account)s || ':INV-2'
"""


async def _pay_one_payout_twice(conn, ids: list[int]) -> None:
    """The payday episode's INV-2 payment moved to INV-1: one payout paid twice, its sibling never, while the
    account still has 2 payouts and 2 payments (the mistake of counting per account)."""
    await conn.execute(SWAP_PAYMENT, {"account": ids[0]})


async def _verify_invariant(fn, domain=None):
    """16.1: the learner's invariant on a clean episode of the payout domain (nothing to report), on a
    killed backend under ``ledger`` (something to report) and on a clean episode with one payout paid twice
    and its sibling never (something to report, which a count per account misses). ``domain``: the
    notebook's ``PAYOUTS``; without it, the same domain from ``examples/payouts.py`` (in a checkout of the
    repository), else one FAILED line that says to pass it."""
    from agentlab.lab.checks import BROKEN_HINT, CLEAN_HINT, invariant_line_count_after, invariant_line_counts

    if domain is None:
        try:
            from examples.payouts import DOMAIN as domain
        except ImportError:
            return [Verdict("domain", None, False, expected_text="the notebook's PAYOUTS", hint=DOMAIN_HINT)]
    try:
        clean, broken = await invariant_line_counts(fn, domain, fault="backend_killed", preset="ledger", seed=0)
        swapped = await invariant_line_count_after(fn, domain, _pay_one_payout_twice, seed=0)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's invariant failed: say so, as check does
        return [Verdict("no_payout_without_its_intent(ctx)", f"raised {type(exc).__name__}: {exc}", False,
                        expected_text="a list of str", hint=HARNESS_HINT)]
    return [Verdict("lines for a clean episode under full", clean, clean == 0, 0, CLEAN_HINT),
            Verdict("lines for backend_killed under ledger", broken, broken > 0, expected_text="at least 1",
                    hint=BROKEN_HINT),
            Verdict("lines for one payout paid twice, its sibling never", swapped, swapped > 0,
                    expected_text="at least 1", hint=PER_PAYOUT_HINT)]


EXERCISES = (
    Exercise(
        id="16.1", title="Your own invariant", function="no_payout_without_its_intent",
        solution="agentlab.course.solutions.ex16_byo_tool:no_payout_without_its_intent",
        verify=_verify_invariant,
    ),
)
