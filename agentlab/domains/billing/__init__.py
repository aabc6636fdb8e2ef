"""The billing domain: customers with store credit, invoices, credit memos and refunds (the refund story).

Its tables live in ``public`` (every constraint) and ``lax`` (the same columns without them), made by its
own migrations (:mod:`agentlab.domains.billing.schema`) on top of the core schema, and seeded with the
customers of ``data/customers.csv``. :data:`DOMAIN` is what the Harness, the failure lab and
``python -m agentlab chaos --domain billing`` (the default) take; its invariants
(:mod:`agentlab.domains.billing.invariants`) reach the lab's checker through it, as any domain's do, and so
do its races for the concurrency family (:mod:`agentlab.domains.billing.concurrency`, ``Domain.races``).
"""

from agentlab.core.domain import Domain
from agentlab.domains.billing.concurrency import CONCURRENCY
from agentlab.domains.billing.errors import HINTS
from agentlab.domains.billing.invariants import INVARIANTS
from agentlab.domains.billing.limits import LIMIT_SCENARIOS, with_limit_tools
from agentlab.domains.billing.rows import episode_rows
from agentlab.domains.billing.scenarios import SCENARIOS, create_customers
from agentlab.domains.billing.schema import MIGRATIONS, SEED_CUSTOMERS_CSV, seed
from agentlab.domains.billing.tools import TOOLS


async def create_rows(conn, scenario, schema: str) -> list[int]:
    """The scenario's customers, new rows in ``schema``; their ids in order."""
    return await create_customers(conn, scenario.customers, schema)


CATALOG_FAULTS = (
    "none", "wrong_type", "negative_amount", "stray_quote", "other_tenant_id", "check_violation",
    "unique_violation", "fk_violation", "lock_timeout", "statement_timeout", "backend_killed",
    "crash_before_checkpoint", "crash_mid_node", "provider_timeout", "worker_crash", "provider_forgot_key",
    "wrong_order",
)
"""The failure lab's catalog faults that fit billing, in the chaos table's order: all of them (the catalog,
:data:`agentlab.lab.faults.FAULTS`, was written for billing's tools, rows and payments)."""

# The domain's tools are the seven of TOOLS and the two check-then-act tools of limits (RedeemCredit,
# RefundWithinCap) that the concurrency faults race; its scenarios add their two stories (redeem,
# capped_refund). ``agentlab.TOOLS`` and ``SCENARIOS`` stay the refund story's seven tools and five stories.
DOMAIN = Domain(
    name="billing", toolset=with_limit_tools(TOOLS), scenarios={**SCENARIOS, **LIMIT_SCENARIOS},
    create_rows=create_rows, migrations=MIGRATIONS, seed=seed, invariants=INVARIANTS, faults=CATALOG_FAULTS, seed_files=(SEED_CUSTOMERS_CSV,), error_hints=HINTS,
    episode_rows=episode_rows, races=CONCURRENCY,
    description="store credit, invoices, credit memos and refunds paid through the outbox",
)
