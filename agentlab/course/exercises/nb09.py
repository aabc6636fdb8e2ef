"""Exercises of notebook 09 (the failure lab): the rung that holds a fault, a fault per scenario, a nemesis of your own."""

from __future__ import annotations

from dataclasses import dataclass

from agentlab.course.exercises import Case, Exercise, Verdict
from agentlab.lab.faults import Fault
from agentlab.lab.runner import Lab
from agentlab.runtime.harness import Harness

NEMESIS_PRESETS = ("naive", "transaction", "ledger", "full")
NEMESIS_KINDS = {  # refund story, seed 0: the kinds of violation the checker names under each preset
    "naive": ["balance_mismatch", "payment_count", "record_count"],
    "transaction": ["payment_count"],
    "ledger": ["payment_count"],
    "full": [],
}
NEMESIS_HINTS = {
    "naive": "without a transaction each call committed on its own before the crash: the resumed run does it "
             "all again (a second deduction, a second refund row and payment)",
    "transaction": "the transaction rolled back, but the provider had been paid inline before the crash: the "
                   "resumed batch pays again (payment_count)",
    "ledger": "the ledger row is written in the same transaction, so it rolled back too: the ledger cannot "
              "help with a crash before the COMMIT",
    "full": "under full the refund is an outbox row, rolled back with the batch: paid once",
    "crashed": "append an async hook to run.node.hooks.after_call; at index 2 raise run.crash('...') (raise "
               "what it returns: a crash called but not raised changes nothing), once only: skip when "
               "run.notes.get('crashes')",
    "resumed": "the once-only guard is missing: a nemesis is in the code, so the restarted process runs your hook "
               "too and dies at the same call again; skip when run.notes.get('crashes') (the first crash noted it)",
}


@dataclass(frozen=True)
class _LearnersFault(Fault):
    """A fault whose ``arm`` is the learner's function; like a bug in the code, the restarted process has it
    too (``rearms``), so a nemesis without its once-only guard crashes the resumed run as well."""

    arm_fn: object = None
    resumes = True
    rearms = True

    async def arm(self, run) -> None:
        await self.arm_fn(run)


async def _verify_nemesis(fn) -> list[Verdict]:
    fault = _LearnersFault("crash_before_commit", "crash_mid_node", "the process dies after the batch's last call, "
                           "before its COMMIT", "outbox", arm_fn=fn)
    verdicts = []
    async with await Harness.open(purpose="exercise") as h, Lab(h) as lab:
        crashed, ended = {}, {}
        for name in NEMESIS_PRESETS:
            try:
                run = await lab.run(fault, name, scenario="refund", seed=0)
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - the learner's arm failed: say so, as check does for a case
                return [Verdict(f"crash_before_commit(run) under {name}", f"raised {type(exc).__name__}: {exc}",
                                False, expected_text="no error", hint=NEMESIS_HINTS["crashed"])]
            crashed[name] = run.crashed
            ended[name] = run.episode.error and run.episode.error.split(" (thread ")[0]  # no id: the same each run
            kinds = sorted({v.kind for v in run.violations})
            verdicts.append(Verdict(f"violations under {name}", kinds, kinds == NEMESIS_KINDS[name],
                                    NEMESIS_KINDS[name], NEMESIS_HINTS[name]))
    verdicts.insert(0, Verdict("crashed and resumed", crashed, all(crashed.values()),
                               {n: True for n in NEMESIS_PRESETS}, NEMESIS_HINTS["crashed"]))
    errors = {n: e for n, e in ended.items() if e is not None}
    verdicts.insert(1, Verdict("the resumed run's error", errors, not errors, expected_text="none under any preset",
                               hint=NEMESIS_HINTS["resumed"]))
    return verdicts


EXERCISES = (
    Exercise(
        id="9.1", title="From which rung on is a fault held?", function="first_safe_preset",
        solution="agentlab.course.solutions.ex09_failure_lab:first_safe_preset",
        cases=(
            Case(args=("crash_before_checkpoint",), expected={
                "violations": {"naive": 9, "constraints": 29, "validated": 29, "transaction": 9, "savepoints": 9,
                               "ledger": 0, "full": 0},
                "safe_from": "ledger"}),
            Case(args=("backend_killed",), expected={"safe_from": "transaction"}),
            Case(args=("provider_timeout",), expected={"safe_from": "full"}),
            Case(args=("wrong_order",), expected={"safe_from": "savepoints"}),
            Case(args=("wrong_type",), expected={"safe_from": "validated"}),
        ),
        hints={
            "violations": "for each preset name of PRESETS (in order) add len((await lab_run(h, preset=name, "
                          "fault=fault, seed=seed)).violations) over seeds 0 and 1",
            "safe_from": "walk the ladder from full downwards and stop at the first preset with violations: "
                         "safe_from is the last one before it (None when full has some)",
            "*": "return {'violations': {preset: count}, 'safe_from': name or None}",
        },
    ),
    Exercise(
        id="9.2", title="One fault, four scenarios", function="violations_per_scenario",
        solution="agentlab.course.solutions.ex09_failure_lab:violations_per_scenario",
        cases=(
            Case(args=("crash_before_checkpoint", "savepoints"), expected={
                "refund": ["leak", "unreported_effect"], "invoice": ["leak", "unreported_effect"],
                "topup": ["leak", "unreported_effect"], "batch": ["leak", "payment_count", "unreported_effect"]}),
            Case(args=("crash_before_checkpoint", "ledger"), expected={
                "refund": [], "invoice": [], "topup": [], "batch": []}),
        ),
        hints={
            "batch": "the batch scenario calls the provider before the call that fails: under savepoints (no "
                     "outbox) the resent batch charges again, payment_count",
            "*": "for scenario in get_fault(fault).scenarios: run lab_run(h, scenario=..., preset=..., fault=..., "
                 "seed=seed) and keep sorted(set(result.violations['kind']))",
        },
    ),
    Exercise(
        id="9.3", title="A nemesis of your own", function="crash_before_commit",
        solution="agentlab.course.solutions.ex09_failure_lab:crash_before_commit",
        verify=_verify_nemesis,
        hints=NEMESIS_HINTS,
    ),
)
