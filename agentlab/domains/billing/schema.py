"""Billing's schema as its own append-only migrations, and its seed customers.

The business tables (``customers``, ``invoices``, ``credit_memos``, ``refunds``) live in ``public`` with
every CHECK, UNIQUE and FOREIGN KEY, and in ``lax`` as the same columns with NOT NULL only, so that the
``constraints`` safeguard is switched off by a real mechanism (the batch's ``search_path``). Both copies
share the id sequences, so an id names one row across both. The agent role may read the business tables,
insert invoices, credit memos and refunds and update a customer's credit; row-level security on the four
tables in ``public`` shows it only the rows of the thread's tenant, and a credit memo may name only an
invoice of its own customer. The ``lax`` copy gets neither: isolation needs ``constraints=True``.

These were the kit's first schema (the core list's first entries); they moved here unchanged, in the same
order, so a billing database holds what it held before (tests/test_schema_layout.py checks the layout).
"""

from __future__ import annotations

import csv
from pathlib import Path

from agentlab.core.agent_role import AGENT_ROLE, TENANT_PREDICATE
from agentlab.core.migrations import Migration
from agentlab.core.schema import LAX_SCHEMA, STRICT_SCHEMA

DATA_DIR = Path(__file__).resolve().parents[3] / "data"
SEED_CUSTOMERS_CSV = DATA_DIR / "customers.csv"
BUSINESS_TABLES = ("customers", "invoices", "credit_memos", "refunds")

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "business tables with their constraints",
        """
        CREATE SEQUENCE customers_id_seq;
        CREATE TABLE customers (
            id           bigint PRIMARY KEY DEFAULT nextval('customers_id_seq'),
            tenant_id    text NOT NULL,
            name         text NOT NULL,
            email        text,
            credit_cents bigint NOT NULL DEFAULT 0
                         CONSTRAINT customers_credit_nonnegative CHECK (credit_cents >= 0),
            created_at   timestamptz NOT NULL DEFAULT now()
        );
        CREATE SEQUENCE invoices_id_seq;
        CREATE TABLE invoices (
            id             bigint PRIMARY KEY DEFAULT nextval('invoices_id_seq'),
            tenant_id      text NOT NULL,
            customer_id    bigint NOT NULL CONSTRAINT invoices_customer_fk REFERENCES customers (id),
            billing_period date NOT NULL,
            amount_cents   bigint NOT NULL CONSTRAINT invoices_amount_positive CHECK (amount_cents > 0),
            status         text NOT NULL DEFAULT 'open'
                           CONSTRAINT invoices_status_valid CHECK (status IN ('open', 'paid', 'void')),
            created_at     timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT invoices_one_per_period UNIQUE (customer_id, billing_period)
        );
        CREATE SEQUENCE credit_memos_id_seq;
        CREATE TABLE credit_memos (
            id           bigint PRIMARY KEY DEFAULT nextval('credit_memos_id_seq'),
            tenant_id    text NOT NULL,
            customer_id  bigint NOT NULL CONSTRAINT credit_memos_customer_fk REFERENCES customers (id),
            reference    text NOT NULL,
            amount_cents bigint NOT NULL CONSTRAINT credit_memos_amount_positive CHECK (amount_cents > 0),
            reason       text NOT NULL DEFAULT '',
            invoice_id   bigint CONSTRAINT credit_memos_invoice_fk REFERENCES invoices (id),
            created_at   timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT credit_memos_one_per_reference UNIQUE (customer_id, reference)
        );
        CREATE SEQUENCE refunds_id_seq;
        CREATE TABLE refunds (
            id           bigint PRIMARY KEY DEFAULT nextval('refunds_id_seq'),
            tenant_id    text NOT NULL,
            customer_id  bigint NOT NULL CONSTRAINT refunds_customer_fk REFERENCES customers (id),
            reference    text NOT NULL,
            amount_cents bigint NOT NULL CONSTRAINT refunds_amount_positive CHECK (amount_cents > 0),
            status       text NOT NULL DEFAULT 'queued'
                         CONSTRAINT refunds_status_valid CHECK (status IN ('queued', 'sent')),
            created_at   timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT refunds_one_per_reference UNIQUE (customer_id, reference)
        );
        CREATE INDEX invoices_customer ON invoices (customer_id);
        CREATE INDEX credit_memos_customer ON credit_memos (customer_id);
        CREATE INDEX refunds_customer ON refunds (customer_id);
        """,
    ),
    Migration(
        "lax copies of the business tables (no CHECK, UNIQUE or FOREIGN KEY) for the naive presets",
        """
        CREATE TABLE lax.customers    (LIKE public.customers    INCLUDING DEFAULTS);
        CREATE TABLE lax.invoices     (LIKE public.invoices     INCLUDING DEFAULTS);
        CREATE TABLE lax.credit_memos (LIKE public.credit_memos INCLUDING DEFAULTS);
        CREATE TABLE lax.refunds      (LIKE public.refunds      INCLUDING DEFAULTS);
        CREATE INDEX lax_customers_id ON lax.customers (id);
        CREATE INDEX lax_invoices_customer ON lax.invoices (customer_id);
        CREATE INDEX lax_credit_memos_customer ON lax.credit_memos (customer_id);
        CREATE INDEX lax_refunds_customer ON lax.refunds (customer_id);
        """,
    ),
    Migration(
        "the agent role's grants and row-level security by tenant on the business tables",
        f"""
        GRANT SELECT ON public.customers, public.invoices, public.credit_memos, public.refunds TO {AGENT_ROLE};
        GRANT UPDATE (credit_cents) ON public.customers TO {AGENT_ROLE};
        GRANT INSERT ON public.invoices, public.credit_memos, public.refunds TO {AGENT_ROLE};
        GRANT USAGE ON SEQUENCE public.invoices_id_seq, public.credit_memos_id_seq, public.refunds_id_seq
            TO {AGENT_ROLE};

        ALTER TABLE public.customers ENABLE ROW LEVEL SECURITY;
        ALTER TABLE public.invoices ENABLE ROW LEVEL SECURITY;
        ALTER TABLE public.credit_memos ENABLE ROW LEVEL SECURITY;
        ALTER TABLE public.refunds ENABLE ROW LEVEL SECURITY;
        CREATE POLICY customers_tenant ON public.customers TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE}) WITH CHECK ({TENANT_PREDICATE});
        CREATE POLICY invoices_tenant ON public.invoices TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE}) WITH CHECK ({TENANT_PREDICATE});
        CREATE POLICY refunds_tenant ON public.refunds TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE}) WITH CHECK ({TENANT_PREDICATE});
        -- a memo may name only an invoice the tenant can see: the foreign key check runs as the table
        -- owner (no row security), so without this a memo could point at another tenant's invoice and
        -- its success or failure would tell whether that invoice exists
        CREATE POLICY credit_memos_tenant ON public.credit_memos TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE})
            WITH CHECK ({TENANT_PREDICATE} AND (credit_memos.invoice_id IS NULL OR EXISTS (
                SELECT 1 FROM public.invoices i WHERE i.id = credit_memos.invoice_id)));
        """,
    ),
    Migration(
        "tenant-scoped foreign keys: a row's tenant must be its customer's (and its invoice's) tenant",
        """
        ALTER TABLE public.customers ADD CONSTRAINT customers_tenant_id_unique UNIQUE (tenant_id, id);
        ALTER TABLE public.invoices ADD CONSTRAINT invoices_tenant_id_unique UNIQUE (tenant_id, id);
        ALTER TABLE public.invoices ADD CONSTRAINT invoices_customer_tenant_fk
            FOREIGN KEY (tenant_id, customer_id) REFERENCES public.customers (tenant_id, id);
        ALTER TABLE public.credit_memos ADD CONSTRAINT credit_memos_customer_tenant_fk
            FOREIGN KEY (tenant_id, customer_id) REFERENCES public.customers (tenant_id, id);
        ALTER TABLE public.credit_memos ADD CONSTRAINT credit_memos_invoice_tenant_fk
            FOREIGN KEY (tenant_id, invoice_id) REFERENCES public.invoices (tenant_id, id);
        ALTER TABLE public.refunds ADD CONSTRAINT refunds_customer_tenant_fk
            FOREIGN KEY (tenant_id, customer_id) REFERENCES public.customers (tenant_id, id);
        """,
    ),
    Migration(
        "a credit memo's invoice must be its customer's invoice: a composite foreign key (and the policy)",
        f"""
        ALTER TABLE public.invoices ADD CONSTRAINT invoices_customer_id_unique UNIQUE (customer_id, id);
        ALTER TABLE public.credit_memos ADD CONSTRAINT credit_memos_invoice_customer_fk
            FOREIGN KEY (customer_id, invoice_id) REFERENCES public.invoices (customer_id, id);
        -- under row security, the same refusal (42501) for another customer's invoice as for none at all
        DROP POLICY credit_memos_tenant ON public.credit_memos;
        CREATE POLICY credit_memos_tenant ON public.credit_memos TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE})
            WITH CHECK ({TENANT_PREDICATE} AND (credit_memos.invoice_id IS NULL OR EXISTS (
                SELECT 1 FROM public.invoices i
                WHERE i.id = credit_memos.invoice_id AND i.customer_id = credit_memos.customer_id)));
        """,
    ),
    Migration(
        "credit redemptions of the check-then-act tools (limits): one row per applied deduction",
        f"""
        -- one table for the strict and the lax presets (no foreign key), so a lost update shows in either
        CREATE SCHEMA limits;
        GRANT USAGE ON SCHEMA limits TO {AGENT_ROLE};
        CREATE SEQUENCE limits.credit_redemptions_id_seq;
        CREATE TABLE limits.credit_redemptions (
            id                  bigint PRIMARY KEY DEFAULT nextval('limits.credit_redemptions_id_seq'),
            tenant_id           text NOT NULL,
            customer_id         bigint NOT NULL,
            amount_cents        bigint NOT NULL CONSTRAINT credit_redemptions_amount_positive CHECK (amount_cents > 0),
            balance_after_cents bigint NOT NULL,
            created_at          timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX credit_redemptions_customer ON limits.credit_redemptions (customer_id);
        GRANT SELECT, INSERT ON limits.credit_redemptions TO {AGENT_ROLE};
        GRANT USAGE ON SEQUENCE limits.credit_redemptions_id_seq TO {AGENT_ROLE};
        ALTER TABLE limits.credit_redemptions ENABLE ROW LEVEL SECURITY;
        CREATE POLICY credit_redemptions_tenant ON limits.credit_redemptions TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE}) WITH CHECK ({TENANT_PREDICATE});
        """,
    ),)

INSERT_SEED_CUSTOMER = (
    "INSERT INTO {schema}.customers (id, tenant_id, name, email, credit_cents) VALUES (%s, %s, %s, %s, %s)"
)
RESET_CUSTOMER_SEQUENCE = "SELECT setval('customers_id_seq', (SELECT max(id) FROM public.customers))"


def seed_rows() -> list[dict]:
    """The seed customers from ``data/customers.csv`` (id, tenant_id, name, email, credit_cents)."""
    with SEED_CUSTOMERS_CSV.open(newline="") as fh:
        return [
            {**row, "id": int(row["id"]), "credit_cents": int(row["credit_cents"])} for row in csv.DictReader(fh)
        ]


def seed(conn) -> None:
    """The seed customers into both copies of ``customers`` (a sync connection, in the caller's transaction)."""
    for schema in (STRICT_SCHEMA, LAX_SCHEMA):
        for row in seed_rows():
            conn.execute(
                INSERT_SEED_CUSTOMER.format(schema=schema),
                (row["id"], row["tenant_id"], row["name"], row["email"], row["credit_cents"]),
            )
    conn.execute(RESET_CUSTOMER_SEQUENCE)
