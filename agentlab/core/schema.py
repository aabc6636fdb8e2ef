"""The core schema as an append-only migration list (:data:`MIGRATIONS`) and the core template it builds.

The core holds what the domain-agnostic pattern needs: the idempotency ledger (``tool_executions``), the
transactional outbox, the events table, the tenant each thread belongs to, the state of sagas, jobs and
approval requests, the simulated provider's records (schema ``provider``) and notification sink's
(``notify``), and the empty ``lax`` schema. A domain brings its own tables as its own migrations
(:class:`agentlab.core.domain.Domain`); billing's live in :mod:`agentlab.domains.billing.schema`.

How a list is applied (append-only, checksummed) is :mod:`agentlab.core.migrations`; the agent role and the
tenant setting its row-level security reads are :mod:`agentlab.core.agent_role`'s (see
:mod:`agentlab.lab.tenancy`). The ``constraints`` safeguard is switched off by a real mechanism: a domain
may keep a copy of its tables in ``lax`` with NOT NULL only (``CREATE TABLE ... (LIKE ... INCLUDING
DEFAULTS)``), and a batch picks the strict (``public``) or the lax copy with ``search_path``.
"""

from __future__ import annotations

import hashlib
from importlib import metadata

import psycopg

# their home moved: the agent role and tenant setting to agent_role, the migration machinery to migrations
from agentlab.core.agent_role import (  # noqa: F401
    AGENT_LOGIN,
    AGENT_ROLE,
    ENSURE_ROLE,
    NO_TENANT,
    SHARED_TABLES,
    TENANT_PREDICATE,
    TENANT_SETTING,
)
from agentlab.core.migrations import (  # noqa: F401
    APPLIED_MIGRATIONS,
    CORE,
    CREATE_MIGRATIONS_TABLE,
    RECORD_MIGRATION,
    Migration,
    applied_checksums,
    apply_migrations,
)

STRICT_SCHEMA = "public"
LAX_SCHEMA = "lax"


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
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
    Migration(
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
    Migration(
        "the lax schema: where a domain keeps copies of its tables without constraints, for the naive presets",
        """
        CREATE SCHEMA lax;
        """,
    ),
    Migration(
        "least-privilege agent role: the ledger and the outbox (a domain grants its own tables)",
        ENSURE_ROLE.format(role=AGENT_ROLE)
        + f"""
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
        GRANT USAGE ON SCHEMA public TO {AGENT_ROLE};
        GRANT SELECT, INSERT ON public.tool_executions TO {AGENT_ROLE};
        GRANT INSERT ON public.outbox TO {AGENT_ROLE};
        GRANT SELECT (id, dedupe_key) ON public.outbox TO {AGENT_ROLE};  -- RETURNING id, ON CONFLICT (dedupe_key)
        """,
    ),
    Migration(
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
    Migration(
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
    Migration(
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
    Migration(
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
    Migration(
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
    Migration(
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
    Migration(
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
    Migration(
        "saga runs: the owner token (a fencing token) of the runner that claimed the run",
        """
        ALTER TABLE saga_runs ADD COLUMN owner_token uuid;
        """,
    ),
    Migration(
        "outbox: pending rows by thread, for delivering a thread's messages in order",
        """
        CREATE INDEX outbox_pending_thread ON outbox (thread_id, id) WHERE status = 'pending';
        """,
    ),
    Migration(
        "approval requests: the interrupt at which a request was shown (an answer binds to it)",
        """
        ALTER TABLE approval_requests ADD COLUMN shown_at integer;
        """,
    ),
    Migration(
        "one writer per thread for a whole run: a lease row per thread with its owner token (case C18)",
        """
        CREATE SCHEMA runs;  -- the kit's own bookkeeping of runs; the agent role has no access to it
        CREATE TABLE runs.thread_leases (
            thread_id   text PRIMARY KEY,
            owner_token text NOT NULL,
            acquired_at timestamptz NOT NULL DEFAULT now(),
            expires_at  timestamptz NOT NULL
        );
        """,
    ),
    Migration(
        "what a payment queued under a natural key asks for, for its own tenant's threads only (case C50)",
        f"""
        -- the agent role may not read the outbox's payloads (every tenant's); this shows it the topic,
        -- customer and amount of the row under one dedupe key, when that row's thread is its tenant's
        CREATE FUNCTION public.queued_payment(wanted_key text)
            RETURNS TABLE (topic text, customer_id jsonb, amount_cents jsonb)
            LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
        AS $$
            SELECT o.topic, o.payload -> 'customer_id', o.payload -> 'amount_cents'
            FROM public.outbox o JOIN public.thread_tenants t ON t.thread_id = o.thread_id
            WHERE o.dedupe_key = wanted_key AND t.tenant_id = nullif(current_setting('{TENANT_SETTING}', true), '')
        $$;
        REVOKE ALL ON FUNCTION public.queued_payment(text) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION public.queued_payment(text) TO {AGENT_ROLE};
        """,
    ),
    Migration(
        "a lease's own TTL: every renewal extends it by that much (a heartbeated lease frees a crashed run's "
        "thread within seconds, case C41)",
        """
        ALTER TABLE runs.thread_leases ADD COLUMN ttl_ms integer NOT NULL DEFAULT 60000 CHECK (ttl_ms > 0);
        """,
    ),
    Migration(
        "the agent role logs in (the tools pool under isolation); its lease renewal and look-ups outside a batch",
        AGENT_LOGIN.format(role=AGENT_ROLE)
        + f"""
        -- a batch renews its run's lease on the tools' own connection: through this function, never the table
        CREATE FUNCTION runs.renew_lease(node_ttl_ms bigint, thread text, token text) RETURNS SETOF text
            LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
            AS $$
                UPDATE runs.thread_leases
                SET expires_at = clock_timestamp() + least(ttl_ms, node_ttl_ms) * interval '1 millisecond'
                WHERE thread_id = thread AND owner_token = token
                RETURNING owner_token
            $$;
        REVOKE ALL ON FUNCTION runs.renew_lease(bigint, text, text) FROM PUBLIC;
        GRANT USAGE ON SCHEMA runs TO {AGENT_ROLE};
        GRANT EXECUTE ON FUNCTION runs.renew_lease(bigint, text, text) TO {AGENT_ROLE};
        CREATE POLICY thread_tenants_lookup ON public.thread_tenants FOR SELECT TO {AGENT_ROLE}
            USING ({NO_TENANT});
        CREATE POLICY tool_executions_lookup ON public.tool_executions FOR SELECT TO {AGENT_ROLE}
            USING ({NO_TENANT});
        """,
    ),
    Migration(
        "tool-call budgets: calls spent per thread and per run, per tool and in total, spent in the batch",
        f"""
        -- one row per counter; tool '*' is the total. A batch spends through runs.spend_calls, in the
        -- call's savepoint: a call undone (its own failure, an atomic rollback) gives its calls back
        CREATE TABLE runs.call_budgets (
            scope       text NOT NULL CONSTRAINT call_budgets_scope_valid CHECK (scope IN ('thread', 'run')),
            scope_id    text NOT NULL,
            tool        text NOT NULL,
            used        integer NOT NULL CONSTRAINT call_budgets_used_nonnegative CHECK (used >= 0),
            limit_calls integer NOT NULL CONSTRAINT call_budgets_limit_positive CHECK (limit_calls > 0),
            PRIMARY KEY (scope, scope_id, tool),
            CONSTRAINT call_budgets_within_limit CHECK (used <= limit_calls)
        );
        -- spend one call on each counter named; returns the counters that had room (the others are unchanged
        -- by this call only once the caller rolls its savepoint back)
        CREATE FUNCTION runs.spend_calls(scopes text[], scope_ids text[], tools text[], limits integer[])
            RETURNS TABLE (scope text, tool text)
            LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
            AS $$
                INSERT INTO runs.call_budgets AS b (scope, scope_id, tool, used, limit_calls)
                SELECT s, i, t, 1, l FROM unnest(scopes, scope_ids, tools, limits) AS u(s, i, t, l)
                ON CONFLICT ON CONSTRAINT call_budgets_pkey DO UPDATE
                    SET used = b.used + 1, limit_calls = excluded.limit_calls
                    WHERE b.used < excluded.limit_calls
                RETURNING b.scope, b.tool
            $$;
        REVOKE ALL ON FUNCTION runs.spend_calls(text[], text[], text[], integer[]) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION runs.spend_calls(text[], text[], text[], integer[]) TO {AGENT_ROLE};
        """,
    ),
    Migration(
        "approval decisions: who decided, and per call approve / edit (the edited arguments and their hash) / "
        "reject (the reviewer's reason)",
        """
        ALTER TABLE approval_requests ADD COLUMN decided_by text, ADD COLUMN decision_details jsonb;
        """,
    ),)


def fingerprint() -> str:
    """A string that changes whenever the core template's content would: its migrations and the saver."""
    parts = [m.checksum for m in MIGRATIONS]
    parts.append(metadata.version("langgraph-checkpoint-postgres"))
    return hashlib.sha256("\n--\n".join(parts).encode()).hexdigest()



def migrate(conn: psycopg.Connection) -> list[int]:
    """Apply the core migrations ``conn``'s database lacks (see :func:`apply_migrations`)."""
    return apply_migrations(conn, CORE, MIGRATIONS)


def build_template(url: str) -> None:
    """Migrate the database at ``url`` with the core list and set up the checkpointer's tables."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    # The saver's setup() needs an autocommit connection with dict rows (case C11).
    with psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        PostgresSaver(conn).setup()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
