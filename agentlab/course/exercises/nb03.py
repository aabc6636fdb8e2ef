"""Exercises of notebook 03 (tools and strict validation)."""

from agentlab.course.exercises import Case, Exercise, Verdict
from agentlab.course.exercises.values import same
from agentlab.domains.billing.errors import find_leaks

REFUSED = "FAILED [invalid_arguments]: "
# (what the case is, the argument dict, the test of the outcome, what is expected, the hint)
TRANSFERS = (
    ("a valid transfer", {"from_customer_id": 1, "to_customer_id": 2, "amount_cents": 500},
     lambda o: same(o, "accepted"), "'accepted'",
     "a valid dict must validate: check the field names and types (CustomerId, Cents)"),
    ("the same customer twice", {"from_customer_id": 1, "to_customer_id": 1, "amount_cents": 500},
     lambda o: o.startswith(REFUSED) and "to_customer_id" in o, "a refusal ('FAILED [invalid_arguments]: ...') naming to_customer_id",
     "a @model_validator(mode='after') that raises ValueError naming to_customer_id when the two ids are equal"),
    ("amount_cents as text", {"from_customer_id": 1, "to_customer_id": 2, "amount_cents": "500"},
     lambda o: o.startswith(REFUSED) and "'amount_cents'" in o and "not text" in o,
     "a refusal naming 'amount_cents' and saying 'not text'",
     "strict=True in the model_config refuses '500' for an int; translate(exc, allowed_args=...).message says so"),
    ("amount_cents as a decimal", {"from_customer_id": 1, "to_customer_id": 2, "amount_cents": 5.5},
     lambda o: o.startswith(REFUSED) and "'amount_cents'" in o and "not a decimal number" in o,
     "a refusal naming 'amount_cents' and saying 'not a decimal number'", "the Cents type (an int) refuses 5.5 in strict mode"),
    ("an argument the tool does not have", {"from_customer_id": 1, "to_customer_id": 2, "amount_cents": 500,
                                            "memo": "x"},
     lambda o: o.startswith(REFUSED) and "'memo' is not an argument" in o, "a refusal saying \"'memo' is not an argument\"",
     "extra='forbid' in the model_config, and allowed_args=tuple(TransferCredit.model_fields) for translate"),
)


def verify_transfers(fn) -> list[Verdict]:
    """Exercise 3.2: ``fn`` (``transfer_outcomes``) on the five argument dicts of :data:`TRANSFERS`."""
    try:
        outcomes = list(fn([dict(args) for _, args, *_ in TRANSFERS]))
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's function failed: say so, as check does for a case
        return [Verdict("transfer_outcomes(cases)", f"raised {type(exc).__name__}: {exc}".splitlines()[0], False,
                        expected_text="one string per argument dict",
                        hint="a refusal is returned, never raised: catch the ValidationError and append "
                             "translate(exc, allowed_args=tuple(TransferCredit.model_fields)).message")]
    if len(outcomes) != len(TRANSFERS) or not all(type(o) is str for o in outcomes):  # a str subclass could lie
        return [Verdict("outcomes", outcomes, False, expected_text=f"{len(TRANSFERS)} strings, one per argument dict")]
    verdicts = [Verdict(name, got, test(got), hint=hint, expected_text=want)
                for (name, _, test, want, hint), got in zip(TRANSFERS, outcomes)]
    leaking = sum(bool(find_leaks(o)) for o in outcomes)
    verdicts.append(Verdict("outcomes that leak", leaking, leaking == 0, 0,
                            "give the model translate(exc, ...).message, never str(exc)"))
    return verdicts


EXERCISES = (
    Exercise(
        id="3.1", title="A period in the middle of the month", function="march_invoices",
        solution="agentlab.course.solutions.ex03_validation:march_invoices",
        cases=(
            Case(args=("constraints",), expected={"outcomes": ["applied", "applied"], "march_invoices": 2}),
            Case(args=("validated",), expected={"outcomes": ["failed", "applied"], "march_invoices": 1}),
        ),
        hints={
            "outcomes": "a list of the two batches' results[0].outcome.value, in the order sent",
            "march_invoices": "count <schema>.invoices of the customer with billing_period >= '2026-03-01' "
                              "and < '2026-04-01', in preset(name).schema",
            "*": "one customer (new_customer(h, 0, schema=preset(name).schema)), two run_batch calls on one thread",
        },
    ),
    Exercise(
        id="3.2", title="A cross-field rule of your own", function="transfer_outcomes",
        solution="agentlab.course.solutions.ex03_validation:transfer_outcomes", verify=verify_transfers,
        hints={"*": "transfer_outcomes(cases) returns one string per dict: 'accepted', or the translated refusal"},
    ),
)
