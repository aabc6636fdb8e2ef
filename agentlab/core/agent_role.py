"""The least-privilege agent role and the tenant setting its row-level security reads.

A cluster-wide role :data:`AGENT_ROLE` (``LOGIN`` since the core migration that lets the tools pool log in
as it) holds only what the tools need: the core grants it the ledger, the outbox and a thread's tenant
(:data:`agentlab.core.schema.MIGRATIONS`); each domain grants it its own tables. Row-level security shows
that role only the rows of the tenant named in the custom setting :data:`TENANT_SETTING`
(:data:`TENANT_PREDICATE`; :data:`NO_TENANT` outside any batch). :data:`ENSURE_ROLE` and
:data:`AGENT_LOGIN` are SQL templates (``{role}`` to fill in) the core migrations run; :data:`SHARED_TABLES`
are the core's tables the role reaches without row-level security, on purpose. See
:mod:`agentlab.lab.tenancy` for the lesson.
"""

from __future__ import annotations

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
# No tenant set: outside any batch (a batch always sets one). The node's own look-ups there, a thread's
# tenant (C25) and, after a lost COMMIT, its ledger rows by key, run on the tools' login as the agent role.
NO_TENANT = f"nullif(current_setting('{TENANT_SETTING}', true), '') IS NULL"

# The agent role may log in, so an isolating preset's tools pool connects as it and has no superuser to go
# back to (case C45). Tolerant: a connecting user that may not alter the role gets a warning here, and the
# tools pool, when it cannot log in, says what to run. Two databases migrating at once may race on the
# role's catalog row ("tuple concurrently updated"): the loser finds it done.
AGENT_LOGIN = """
DO $$
BEGIN
    IF NOT (SELECT rolcanlogin FROM pg_roles WHERE rolname = '{role}') THEN
        ALTER ROLE {role} LOGIN;
    END IF;
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE WARNING 'the connecting role % cannot let {role} log in', current_user
            USING HINT = 'as a superuser run: ALTER ROLE {role} LOGIN';
    WHEN internal_error THEN
        IF NOT (SELECT rolcanlogin FROM pg_roles WHERE rolname = '{role}') THEN
            RAISE;
        END IF;
END
$$;
"""
# The core's tables the agent role may reach without row-level security, on purpose (case C42): the outbox
# has no tenant column; the agent inserts intents and reads back only ``id`` and ``dedupe_key``.
SHARED_TABLES = ("public.outbox",)
