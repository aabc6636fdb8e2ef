"""The schema as an append-only migration list, and the template every fresh database copies.

Rules (as langgraph-checkpoint-postgres does it): a migration's position in :data:`MIGRATIONS` is its
version, stored in ``schema_migrations``; an entry is never edited or reordered, only appended.

Two copies of the business tables exist so that the ``constraints`` safeguard can be switched off by
a real mechanism: ``public`` holds them with every CHECK, UNIQUE and FOREIGN KEY; ``lax`` holds the
same columns with NOT NULL only (``CREATE TABLE ... (LIKE ... INCLUDING DEFAULTS)``). A batch picks
one with ``search_path``. Both share the id sequences, so an id names one row across both.
The ledger, the outbox and the events table live in ``public`` only; the fake payment provider keeps
its records in its own schema ``provider``, the fake notification sink in ``notify``.

Least privilege and tenant isolation (migration 4, see :mod:`agentlab.lab.tenancy`): a cluster-wide
``NOLOGIN`` role :data:`AGENT_ROLE` holds only what the tools need in ``public`` (read the business
tables, insert invoices / credit memos / refunds, update a customer's credit, insert and read the
ledger, insert into the outbox); row-level security on the four business tables in ``public`` shows
that role only the rows of the tenant in the setting :data:`TENANT_SETTING`; later migrations put the
ledger and ``thread_tenants`` (a thread's tenant, bound by its first batch) under the same rule. The
``lax`` copy gets neither: isolation needs ``constraints=True``.
"""

from __future__ import annotations

import csv
import hashlib
from importlib import metadata
from pathlib import Path

import psycopg

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
SEED_CUSTOMERS_CSV = DATA_DIR / "customers.csv"

STRICT_SCHEMA = "public"
LAX_SCHEMA = "lax"
BUSINESS_TABLES = ("customers", "invoices", "credit_memos", "refunds")
AGENT_ROLE = "agentlab_agent"  # cluster-wide; the tools node runs tool SQL as this role under isolation
TENANT_SETTING = "agentlab.tenant_id"  # custom setting the row-level security policies read

# Roles are cluster-wide and several databases (and servers) may migrate at once: create the role only
# when missing and treat "already exists" from a concurrent CREATE ROLE as success. A connecting user
# that is not a superuser (it needs CREATEROLE then) is made a member so that it can SET ROLE to it;
# on PostgreSQL 16+ it can do that only for a role it created itself, else a superuser must grant it.
ENSURE_ROLE = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN
        CREATE ROLE {role} NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- created concurrently by another database's migration
END
$$;
DO $$
BEGIN
    -- PostgreSQL 16+ gives a role's creator ADMIN only; SET ROLE needs the SET option
    IF NOT pg_has_role(current_user, '{role}',
                       CASE WHEN current_setting('server_version_num')::int >= 160000 THEN 'SET' ELSE 'MEMBER' END) THEN
        EXECUTE format('GRANT {role} TO %I', current_user);
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL;
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
            MESSAGE = format('the connecting role %I cannot SET ROLE {role}', current_user),
            HINT = format('as a superuser run: GRANT {role} TO %I', current_user);
END
$$;
"""
# Visible to the agent role: rows of the tenant named by the setting (no setting, no rows).
TENANT_PREDICATE = f"tenant_id = nullif(current_setting('{TENANT_SETTING}', true), '')"

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

MIGRATIONS: list[tuple[str, str]] = [
    (
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
    (
        "idempotency ledger, transactional outbox, events",
        """
        CREATE TABLE tool_executions (
            idempotency_key text PRIMARY KEY,
            thread_id       text NOT NULL,
            tool_call_id    text NOT NULL,
            tool_name       text NOT NULL,
            args            jsonb NOT NULL,
            result          jsonb NOT NULL,
            attempt         integer NOT NULL DEFAULT 1,
            created_at      timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX tool_executions_thread ON tool_executions (thread_id);
        CREATE TABLE outbox (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            topic         text NOT NULL,
            payload       jsonb NOT NULL,
            dedupe_key    text NOT NULL CONSTRAINT outbox_dedupe_key_unique UNIQUE,
            status        text NOT NULL DEFAULT 'pending'
                          CONSTRAINT outbox_status_valid CHECK (status IN ('pending', 'dispatched', 'dead_letter')),
            attempts      integer NOT NULL DEFAULT 0,
            last_error    text,
            thread_id     text,
            provider_ref  text,
            available_at  timestamptz NOT NULL DEFAULT now(),
            created_at    timestamptz NOT NULL DEFAULT now(),
            dispatched_at timestamptz
        );
        CREATE INDEX outbox_pending ON outbox (available_at, id) WHERE status = 'pending';
        CREATE TABLE events (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            thread_id    text,
            node         text NOT NULL,
            tool_name    text,
            tool_call_id text,
            outcome      text NOT NULL,
            category     text,
            sqlstate     text,
            error_class  text,
            detail       text,
            attempt      integer NOT NULL DEFAULT 1,
            latency_ms   double precision,
            created_at   timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX events_thread ON events (thread_id, id);
        """,
    ),
    (
        "fake payment provider's own records",
        """
        CREATE SCHEMA provider;
        CREATE TABLE provider.payments (
            id              text PRIMARY KEY,
            kind            text NOT NULL CHECK (kind IN ('charge', 'refund')),
            customer        text NOT NULL,
            amount_cents    bigint NOT NULL,
            currency        text NOT NULL DEFAULT 'usd',
            reference       text,
            idempotency_key text,
            created_at      timestamptz NOT NULL
        );
        CREATE INDEX provider_payments_customer ON provider.payments (customer);
        CREATE INDEX provider_payments_reference ON provider.payments (reference);
        CREATE TABLE provider.idempotency_keys (
            key          text PRIMARY KEY,
            request_hash text NOT NULL,
            response     jsonb NOT NULL,
            created_at   timestamptz NOT NULL
        );
        """,
    ),
    (
        "lax copies of the business tables (no CHECK, UNIQUE or FOREIGN KEY) for the naive presets",
        """
        CREATE SCHEMA lax;
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
    (
        "least-privilege agent role and row-level security by tenant on the business tables",
        ENSURE_ROLE.format(role=AGENT_ROLE)
        + f"""
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
        GRANT USAGE ON SCHEMA public TO {AGENT_ROLE};
        GRANT SELECT ON public.customers, public.invoices, public.credit_memos, public.refunds TO {AGENT_ROLE};
        GRANT UPDATE (credit_cents) ON public.customers TO {AGENT_ROLE};
        GRANT INSERT ON public.invoices, public.credit_memos, public.refunds TO {AGENT_ROLE};
        GRANT USAGE ON SEQUENCE public.invoices_id_seq, public.credit_memos_id_seq, public.refunds_id_seq
            TO {AGENT_ROLE};
        GRANT SELECT, INSERT ON public.tool_executions TO {AGENT_ROLE};
        GRANT INSERT ON public.outbox TO {AGENT_ROLE};
        GRANT SELECT (id, dedupe_key) ON public.outbox TO {AGENT_ROLE};  -- RETURNING id, ON CONFLICT (dedupe_key)

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
    (
        "sagas: runs, steps with their compensations, a journal, compensation needed by a person",
        """
        CREATE TABLE saga_runs (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            saga          text NOT NULL,
            run_key       text NOT NULL CONSTRAINT saga_runs_one_per_key UNIQUE,
            status        text NOT NULL DEFAULT 'running'
                          CONSTRAINT saga_runs_status_valid
                          CHECK (status IN ('running', 'compensating', 'completed', 'compensated', 'parked')),
            direction     text NOT NULL DEFAULT 'forward'
                          CONSTRAINT saga_runs_direction_valid CHECK (direction IN ('forward', 'backward')),
            input         jsonb NOT NULL,
            failed_step   integer,
            parked_reason text,
            created_at    timestamptz NOT NULL DEFAULT now(),
            updated_at    timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT saga_runs_parked_has_reason CHECK ((status = 'parked') = (parked_reason IS NOT NULL))
        );
        CREATE TABLE saga_steps (
            run_id         bigint NOT NULL CONSTRAINT saga_steps_run_fk REFERENCES saga_runs (id),
            position       integer NOT NULL CONSTRAINT saga_steps_position_positive CHECK (position >= 1),
            name           text NOT NULL,
            external       boolean NOT NULL DEFAULT false,
            status         text NOT NULL DEFAULT 'pending'
                           CONSTRAINT saga_steps_status_valid CHECK (status IN (
                               'pending', 'running', 'completed', 'failed',
                               'compensated', 'sent_but_unwound', 'compensation_failed')),
            attempts       integer NOT NULL DEFAULT 0,
            result         jsonb,
            compensation   jsonb,
            last_error     text,
            completed_at   timestamptz,
            compensated_at timestamptz,
            PRIMARY KEY (run_id, position),
            CONSTRAINT saga_steps_done_has_result CHECK (
                status IN ('pending', 'running', 'failed') OR (result IS NOT NULL AND compensation IS NOT NULL))
        );
        CREATE TABLE saga_log (
            id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id      bigint NOT NULL CONSTRAINT saga_log_run_fk REFERENCES saga_runs (id),
            position    integer,
            step        text,
            action      text NOT NULL,
            attempt     integer,
            error_class text,
            detail      text,
            created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
        );
        CREATE INDEX saga_log_run ON saga_log (run_id, id);
        CREATE TABLE compensation_needed (
            id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id      bigint NOT NULL CONSTRAINT compensation_needed_run_fk REFERENCES saga_runs (id),
            position    integer NOT NULL,
            step        text NOT NULL,
            action      jsonb NOT NULL,
            reason      text NOT NULL,
            status      text NOT NULL DEFAULT 'open'
                        CONSTRAINT compensation_needed_status_valid CHECK (status IN ('open', 'resolved')),
            created_at  timestamptz NOT NULL DEFAULT now(),
            resolved_at timestamptz,
            CONSTRAINT compensation_needed_resolved_at CHECK ((status = 'resolved') = (resolved_at IS NOT NULL))
        );
        CREATE UNIQUE INDEX compensation_needed_one_open_per_run ON compensation_needed (run_id) WHERE status = 'open';
        """,
    ),
    (
        "job state: one live job per key, a result exactly when succeeded",
        """
        CREATE TABLE jobs (
            id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            job_key     text NOT NULL,
            kind        text NOT NULL,
            args        jsonb NOT NULL,
            status      text NOT NULL DEFAULT 'pending'
                        CONSTRAINT jobs_status_valid
                        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'unknown')),
            attempt     integer NOT NULL DEFAULT 0,
            result      jsonb,
            error       text,
            lease_until timestamptz,
            created_at  timestamptz NOT NULL DEFAULT now(),
            started_at  timestamptz,
            finished_at timestamptz,
            CONSTRAINT jobs_result_iff_succeeded CHECK ((status = 'succeeded') = (result IS NOT NULL)),
            CONSTRAINT jobs_running_has_lease CHECK (status <> 'running' OR lease_until IS NOT NULL),
            CONSTRAINT jobs_finished_iff_final CHECK ((status IN ('succeeded', 'failed')) = (finished_at IS NOT NULL))
        );
        CREATE UNIQUE INDEX jobs_one_live_per_key ON jobs (job_key) WHERE status <> 'failed';
        """,
    ),
    (
        "human approval requests: one per batch, keyed by thread, node and super-step",
        """
        CREATE TABLE approval_requests (
            request_key  text PRIMARY KEY,
            thread_id    text NOT NULL,
            node         text NOT NULL,
            step         integer NOT NULL,
            calls        jsonb NOT NULL,
            status       text NOT NULL DEFAULT 'pending'
                         CONSTRAINT approval_requests_status_valid CHECK (status IN ('pending', 'decided')),
            decisions    jsonb,
            requested_at timestamptz NOT NULL DEFAULT now(),
            decided_at   timestamptz,
            CONSTRAINT approval_requests_decided CHECK (
                (status = 'decided') = (decisions IS NOT NULL AND decided_at IS NOT NULL))
        );
        CREATE INDEX approval_requests_thread ON approval_requests (thread_id);
        """,
    ),
    (
        "fake notification sink's own records",
        """
        CREATE SCHEMA notify;
        CREATE TABLE notify.messages (
            id         text PRIMARY KEY,
            recipient  text NOT NULL,
            subject    text NOT NULL,
            body       text NOT NULL,
            reference  text,
            corrects   text,
            created_at timestamptz NOT NULL
        );
        CREATE INDEX notify_messages_reference ON notify.messages (reference);
        """,
    ),
    (
        "events: kind (node execution, tool call, note), super-step, start time, token counts",
        """
        ALTER TABLE events
            ADD COLUMN kind text NOT NULL DEFAULT 'note'
                CONSTRAINT events_kind_valid CHECK (kind IN ('node', 'call', 'note')),
            ADD COLUMN step integer,
            ADD COLUMN started_at timestamptz,
            ADD COLUMN input_tokens integer,
            ADD COLUMN output_tokens integer;
        """,
    ),
    (
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
    (
        "ledger key: tenant, thread, call id and occurrence as one JSON array; row-level security by tenant",
        f"""
        ALTER TABLE tool_executions
            ADD COLUMN tenant_id text,
            ADD COLUMN occurrence integer NOT NULL DEFAULT 0
                CONSTRAINT tool_executions_occurrence_nonnegative CHECK (occurrence >= 0);
        -- rows written before this migration had the ambiguous key thread_id || ':' || tool_call_id and
        -- no tenant: they keep their thread and call id, under the new key with no tenant
        UPDATE tool_executions
            SET idempotency_key = jsonb_build_array(NULL::text, thread_id, tool_call_id, 0)::text;
        CREATE INDEX tool_executions_tenant_thread ON tool_executions (tenant_id, thread_id);
        ALTER TABLE public.tool_executions ENABLE ROW LEVEL SECURITY;
        CREATE POLICY tool_executions_tenant ON public.tool_executions TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE}) WITH CHECK ({TENANT_PREDICATE});
        """,
    ),
    (
        "the tenant each thread belongs to, bound by its first batch (replay with LangGraph's own config)",
        f"""
        CREATE TABLE thread_tenants (
            thread_id  text PRIMARY KEY,
            tenant_id  text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        );
        GRANT SELECT, INSERT ON public.thread_tenants TO {AGENT_ROLE};
        ALTER TABLE public.thread_tenants ENABLE ROW LEVEL SECURITY;
        CREATE POLICY thread_tenants_tenant ON public.thread_tenants TO {AGENT_ROLE}
            USING ({TENANT_PREDICATE}) WITH CHECK ({TENANT_PREDICATE});
        """,
    ),
    (
        "saga runs: the owner token (a fencing token) of the runner that claimed the run",
        """
        ALTER TABLE saga_runs ADD COLUMN owner_token uuid;
        """,
    ),
    (
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
    (
        "outbox: pending rows by thread, for delivering a thread's messages in order",
        """
        CREATE INDEX outbox_pending_thread ON outbox (thread_id, id) WHERE status = 'pending';
        """,
    ),
    (
        "approval requests: the interrupt at which a request was shown (an answer binds to it)",
        """
        ALTER TABLE approval_requests ADD COLUMN shown_at integer;
        """,
    ),
]

INSERT_SEED_CUSTOMER = (
    "INSERT INTO {schema}.customers (id, tenant_id, name, email, credit_cents) VALUES (%s, %s, %s, %s, %s)"
)
RESET_CUSTOMER_SEQUENCE = "SELECT setval('customers_id_seq', (SELECT max(id) FROM public.customers))"


def fingerprint() -> str:
    """A string that changes whenever the template's content would: migrations, seed data, saver."""
    parts = [sql for _, sql in MIGRATIONS]
    parts.append(SEED_CUSTOMERS_CSV.read_text() if SEED_CUSTOMERS_CSV.exists() else "")
    parts.append(metadata.version("langgraph-checkpoint-postgres"))
    return hashlib.sha256("\n--\n".join(parts).encode()).hexdigest()


def migrate(conn: psycopg.Connection) -> list[int]:
    """Apply the migrations ``conn``'s database lacks, each in its own transaction; return their versions."""
    applied: list[int] = []
    with conn.transaction():
        conn.execute(CREATE_MIGRATIONS_TABLE)
    done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
    for version, (name, ddl) in enumerate(MIGRATIONS):
        if version in done:
            continue
        with conn.transaction():
            conn.execute(ddl)
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
        applied.append(version)
    return applied


def seed_rows() -> list[dict]:
    """The seed customers from ``data/customers.csv`` (id, tenant_id, name, email, credit_cents)."""
    with SEED_CUSTOMERS_CSV.open(newline="") as fh:
        return [
            {**row, "id": int(row["id"]), "credit_cents": int(row["credit_cents"])} for row in csv.DictReader(fh)
        ]


def build_template(url: str) -> None:
    """Migrate, seed and set up the checkpointer's tables in the database at ``url``."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        with conn.transaction():
            for schema in (STRICT_SCHEMA, LAX_SCHEMA):
                for row in seed_rows():
                    conn.execute(
                        INSERT_SEED_CUSTOMER.format(schema=schema),
                        (row["id"], row["tenant_id"], row["name"], row["email"], row["credit_cents"]),
                    )
            conn.execute(RESET_CUSTOMER_SEQUENCE)
    # The saver's setup() needs an autocommit connection with dict rows (case C11).
    with psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
