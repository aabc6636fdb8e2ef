"""Exercises of notebook 16 (bring your own tool): your own invariant."""

from __future__ import annotations

from agentlab.lab.exercises import Exercise, Verdict


async def _verify_invariant(fn, domain=None):
    """16.1: the learner's invariant on a clean episode of the payout domain (nothing to report) and on a
    killed backend under ``ledger`` (something to report). ``domain``: the notebook's ``PAYOUTS``; without
    it, the same domain from ``examples/payouts.py`` (in a checkout of the repository)."""
    from agentlab.lab.checks import BROKEN_HINT, CLEAN_HINT, invariant_line_counts

    if domain is None:
        try:
            from examples.payouts import DOMAIN as domain
        except ImportError:
            raise ValueError("exercise 16.1 needs the notebook's domain: await check('16.1', fn, domain=PAYOUTS)") from None
    try:
        clean, broken = await invariant_line_counts(fn, domain, fault="backend_killed", preset="ledger", seed=0)
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's invariant failed: say so, as check does
        return [Verdict("no_payout_without_its_intent(ctx)", f"raised {type(exc).__name__}: {exc}", False,
                        expected_text="a list of str", hint="run your SQL on ctx.conn; % in a LIKE pattern is %%")]
    return [Verdict("lines for a clean episode under full", clean, clean == 0, 0, CLEAN_HINT),
            Verdict("lines for backend_killed under ledger", broken, broken > 0, expected_text="at least 1",
                    hint=BROKEN_HINT)]


EXERCISES = (
    Exercise(
        id="16.1", title="Your own invariant", function="no_payout_without_its_intent",
        solution="solutions.ex16_byo_tool:no_payout_without_its_intent",
        verify=_verify_invariant,
    ),
)
