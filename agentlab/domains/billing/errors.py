"""Billing's side of the error translator: what its model is told for its own constraints, and the
internal names of its schema that must never reach it (``DOMAIN.error_hints``).

``agentlab.RULES``, ``agentlab.translate`` and ``agentlab.find_leaks`` are the ones here: the core's
(:mod:`agentlab.core.errors`) with billing's hints, as the package's top level speaks the default domain.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentlab.core import errors, leaks
from agentlab.core.errors import ErrorHints, Translation, rules_for

FK_HINT = "a record named by an id does not exist; check the ids (LookupCustomer finds a customer)."

# constraint name -> what the model is told when a write breaks it (agentlab.domains.billing.schema)
CONSTRAINT_HINTS = {
    "customers_credit_nonnegative": (
        "the customer's credit balance is too low for this amount; apply at most the available "
        "credit (LookupCustomer shows it)."
    ),
    "invoices_amount_positive": "the amount must be a positive whole number of cents.",
    "credit_memos_amount_positive": "the amount must be a positive whole number of cents.",
    "refunds_amount_positive": "the amount must be a positive whole number of cents.",
    "invoices_status_valid": "the status must be one of open, paid, void.",
    "invoices_one_per_period": "an invoice for this customer and billing period already exists; do not create it again.",
    "credit_memos_one_per_reference": "a credit memo with this reference already exists for this customer; do not create it again.",
    "refunds_one_per_reference": "a refund with this reference already exists for this customer; do not send it again.",
}

# billing's internal names that must never reach the model (tool argument names are public and allowed)
INTERNAL_IDENTIFIERS = (
    "credit_cents", "credit_memos",
    "customers_credit_nonnegative", "invoices_one_per_period", "credit_memos_one_per_reference",
    "refunds_one_per_reference", "invoices_customer_fk", "credit_memos_customer_fk", "refunds_customer_fk",
    "credit_memos_invoice_fk", "customers_tenant_id_unique", "invoices_tenant_id_unique",
    "invoices_customer_tenant_fk", "credit_memos_customer_tenant_fk", "credit_memos_invoice_tenant_fk",
    "refunds_customer_tenant_fk",
)

HINTS = ErrorHints(constraints=CONSTRAINT_HINTS, sqlstates={"23503": FK_HINT}, identifiers=INTERNAL_IDENTIFIERS)

RULES = rules_for(HINTS)  # the translation table as billing's model is told it


def translate(exc: BaseException, *, allowed_args: tuple[str, ...] = (), sanitize: bool = True) -> Translation:
    """:func:`agentlab.core.errors.translate` with billing's hints (:data:`HINTS`)."""
    return errors.translate(exc, allowed_args=allowed_args, sanitize=sanitize, hints=HINTS)


def find_leaks(text: str, identifiers: Iterable[str] = ()) -> list[str]:
    """:func:`agentlab.core.leaks.find_leaks` flagging billing's :data:`INTERNAL_IDENTIFIERS` too."""
    return leaks.find_leaks(text, (*INTERNAL_IDENTIFIERS, *identifiers))
