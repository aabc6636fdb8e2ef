"""Least privilege and tenant isolation: the database refuses what the agent must not do.

A hallucinated id that belongs to another tenant passes validation and, without isolation, succeeds.
Under :attr:`agentlab.core.safeguards.Safeguards.isolation` (preset ``full``) the database refuses it,
whatever the tool's SQL says:

- a migration creates the cluster-wide role :data:`AGENT_ROLE` (a later one lets it log in) with only what the tools
  need (read the business tables, insert invoices, credit memos and refunds, update a customer's
  credit, read and insert ledger rows, insert outbox rows): no DELETE, no TRUNCATE, no DDL, nothing on
  the checkpoint tables, the events table, the provider's schema or the ``lax`` copy;
- row-level security on ``customers``, ``invoices``, ``credit_memos`` and ``refunds`` shows that role
  only the rows whose ``tenant_id`` equals the setting :data:`TENANT_SETTING` (no setting, no rows);
  writes are held to the same rule (``WITH CHECK``), and a credit memo may name only an invoice the
  tenant can see;
- under isolation the tools node runs on a pool that logs in as :data:`AGENT_ROLE` itself
  (:meth:`agentlab.runtime.harness.Harness.pool_for`, case C45), and starts each batch transaction with
  ``set_config('role', AGENT_ROLE, true)`` (a no-op there, kept for a node handed the owner's pool) and
  ``set_config(TENANT_SETTING, <tenant>, true)`` (``SET LOCAL``: it ends with the transaction). The tenant is the graph config's
  ``config["configurable"]["tenant_id"]`` (:func:`agentlab.core.graph.run_config`), never a tool argument
  (the argument models forbid unknown keys, and the handlers read only their own fields);
- a customer of another tenant is invisible: the tool finds no row and answers ``FAILED [not_found]``
  with the same text as for an id that does not exist, so the model learns nothing about other
  tenants. A write refused by a policy is SQLSTATE 42501, which the translator maps to not_found.

The checkpointer, the outbox worker, the event log and the payment provider keep the connection's own
role (they are the kit's infrastructure, not the agent's tools).

Limits, said plainly: logging in as the role (instead of ``SET ROLE`` on the owner's login, which
``RESET ROLE`` undid) bounds what any SQL on the tools' connection can do to the role's grants: no DDL,
no DELETE, no other role to become. Row-level security by tenant is not such a bound against SQL text an
attacker controls: any role may set a custom setting, so such SQL could name another tenant. Outside a
batch (no tenant set) the role reads the thread bindings and ledger rows by key: the node's own look-ups
(a thread's tenant, the ledger after a lost COMMIT) run on its login. Ids come from sequences shared by
all tenants, so a tenant may see gaps in them.

Sources: PostgreSQL docs "Row Security Policies" (ddl-rowsecurity), "CREATE POLICY", "SET ROLE",
"GRANT", "Privileges", "Customized Options" (``current_setting(name, missing_ok)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from agentlab.core.agent_role import AGENT_ROLE, TENANT_SETTING
from agentlab.core.isolation import TenantRequired, isolation_prelude, require_tenant
from agentlab.domains.billing.tenancy import (  # noqa: F401 (their home moved; these names stay)
    EFFECT_COUNTS,
    SINCE,
    CrossTenantEffect,
    cross_tenant_effects,
    effect_counts_query,
    effects_from,
    named_customer_ids,
)

__all__ = [
    "AGENT_ROLE", "FORBIDDEN_STATEMENTS", "TENANT_SETTING", "AgentProbe", "CrossTenantEffect", "TenantRequired",
    "agent_privileges", "compare_isolation", "create_foreign_customer", "cross_tenant_effects", "effect_counts_query",
    "effects_from", "foreign_tenant", "isolation_prelude", "named_customer_ids", "require_tenant", "try_as_agent", "with_foreign_customer",
]

# What the agent role must be refused (SQLSTATE 42501), for a lesson: loop over them with try_as_agent.
FORBIDDEN_STATEMENTS = (
    "DROP TABLE customers",
    "TRUNCATE invoices",
    "ALTER TABLE customers ADD COLUMN note text",
    "ALTER TABLE customers DISABLE ROW LEVEL SECURITY",
    "CREATE TABLE public.scratch (id int)",
    "DELETE FROM customers WHERE id = 1",
    "UPDATE customers SET tenant_id = 'globex' WHERE id = 1",
    "SELECT * FROM provider.payments",
    "SELECT * FROM checkpoints",
    "SELECT * FROM events",
    "SELECT payload FROM outbox",
    "DELETE FROM tool_executions",
    "SELECT * FROM lax.customers",
)
OTHER_TENANTS = ("globex", "initech", "umbrella")  # seed tenants other than the demo scenarios' "acme"
FOREIGN_CUSTOMER_NAME = "Globex Holdings"

INSERT_CUSTOMER = "INSERT INTO {schema}.customers (tenant_id, name, credit_cents) VALUES (%s, %s, %s) RETURNING id"
CUSTOMER_TENANTS = "SELECT id, tenant_id, credit_cents FROM {schema}.customers WHERE id = ANY(%(ids)s)"
RELATIONS = """
SELECT n.nspname, c.relname, c.relrowsecurity,
       has_table_privilege(%(role)s, c.oid, 'SELECT'), has_any_column_privilege(%(role)s, c.oid, 'SELECT'),
       has_table_privilege(%(role)s, c.oid, 'INSERT'),
       has_table_privilege(%(role)s, c.oid, 'UPDATE'), has_any_column_privilege(%(role)s, c.oid, 'UPDATE'),
       has_table_privilege(%(role)s, c.oid, 'DELETE'), has_table_privilege(%(role)s, c.oid, 'TRUNCATE'),
       has_table_privilege(%(role)s, c.oid, 'REFERENCES'), has_table_privilege(%(role)s, c.oid, 'TRIGGER'),
       has_schema_privilege(%(role)s, n.oid, 'USAGE'), has_schema_privilege(%(role)s, n.oid, 'CREATE')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname IN ('public', 'lax', 'provider')
ORDER BY n.nspname, c.relname
"""


def foreign_tenant(tenant_id: str) -> str:
    """A tenant other than ``tenant_id`` (one of the seed's tenants)."""
    return next(t for t in OTHER_TENANTS if t != tenant_id)


# --------------------------------------------------------------------------- the cross-tenant fault


async def create_foreign_customer(conn, schema: str, thread_tenant: str, *, tenant_id: str | None = None,
                                  name: str = FOREIGN_CUSTOMER_NAME, credit_cents: int = 5000) -> int:
    """Insert a customer of a tenant other than ``thread_tenant`` into ``schema`` (``public`` or ``lax``)
    on ``conn`` (an ``AsyncConnection`` as the database owner); return its id.

    It is a real row of that tenant: the "hallucinated another tenant's id" fault sends its id.
    """
    tenant_id = tenant_id or foreign_tenant(thread_tenant)
    if tenant_id == thread_tenant:
        raise ValueError("the foreign customer's tenant must differ from the thread's tenant")
    query = sql.SQL(INSERT_CUSTOMER).format(schema=sql.Identifier(schema))
    cur = await conn.execute(query, (tenant_id, name, credit_cents))
    return (await cur.fetchone())[0]


def with_foreign_customer(scenario, step: int = 0, index: int | None = None, *, tenant_id: str | None = None,
                          credit_cents: int = 5000):
    """The "hallucinated another tenant's id" fault as a scenario: ``scenario`` plus a customer of
    another tenant (created by the episode like its other customers), and one planned call that first
    names that customer; told "not found", the model sends the call with the right customer.

    Args:
        scenario: an :class:`agentlab.domains.billing.scenarios.Scenario`.
        step, index: the planned call to corrupt; ``index=None`` picks the first call of ``step`` that
            writes, names a customer and has no fix of its own.
        tenant_id: the other tenant (default: :func:`foreign_tenant` of the scenario's tenant).
        credit_cents: the foreign customer's opening credit; the intended end state leaves it untouched.

    Raises:
        ValueError: no call fits, or the chosen call already carries a fix.
    """
    from agentlab.domains.billing.scenarios import C, CustomerSpec
    from agentlab.domains.billing.tools import TOOLS

    calls = scenario.steps[step]
    if index is None:
        index = next((i for i, c in enumerate(calls) if c.fix is None and isinstance(c.args.get("customer_id"), C)
                      and TOOLS[c.tool].writes), None)
        if index is None:
            raise ValueError(f"step {step} of {scenario.name!r} has no writing call naming a customer without a fix")
    call = calls[index]
    if call.fix is not None:
        raise ValueError("the chosen call already has a fix; pick a call without one")
    foreign = len(scenario.customers)
    spec = CustomerSpec(tenant_id or foreign_tenant(scenario.tenant_id), FOREIGN_CUSTOMER_NAME, credit_cents)
    intended = scenario.intended
    extended = {
        f.name: (*getattr(intended, f.name), credit_cents if f.name == "final_credit_cents" else 0)
        for f in dataclasses.fields(intended) if getattr(intended, f.name)
    }
    sc = scenario.with_call(step, index, args={**call.args, "customer_id": C(foreign)}, fix=dict(call.args))
    return dataclasses.replace(sc, name=f"{scenario.name}+foreign_id", customers=(*scenario.customers, spec),
                               intended=dataclasses.replace(intended, **extended))


# --------------------------------------------------------------------------- looking at the role


@dataclass(frozen=True)
class AgentProbe:
    """What happened when a statement ran as the agent role: ``sqlstate`` is None when it succeeded."""

    statement: str
    sqlstate: str | None
    message: str
    rows: int

    @property
    def refused(self) -> bool:
        return self.sqlstate is not None


async def try_as_agent(conn, statement: str, params: Sequence | Mapping | None = None, *,
                       tenant_id: str = "acme") -> AgentProbe:
    """Run ``statement`` as :data:`AGENT_ROLE` for ``tenant_id`` in a transaction that is always rolled
    back, on ``conn`` (an autocommit ``AsyncConnection`` as the database owner), and report the outcome.

    For a lesson or a test (``DROP TABLE customers`` is refused with SQLSTATE 42501); the statement is
    the caller's own text, never a model's. ``message`` is PostgreSQL's primary message, not model-facing.
    """
    parts, values = isolation_prelude(tenant_id)
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute("SELECT " + ", ".join(parts), values)
            cur = await conn.execute(statement, params)
            rows = len(await cur.fetchall()) if cur.description else max(cur.rowcount, 0)
        return AgentProbe(statement, None, "ok", rows)
    except psycopg.Error as exc:
        return AgentProbe(statement, exc.sqlstate, exc.diag.message_primary or str(exc), 0)


async def agent_privileges(conn, role: str = AGENT_ROLE) -> list[dict]:
    """What ``role`` may do on every table of the ``public``, ``lax`` and ``provider`` schemas.

    Returns one dict per table: ``table`` (``schema.name``), ``row_security`` (policies enabled) and a
    bool per privilege: ``select``, ``insert``, ``update``, ``delete``, ``truncate``, ``references``,
    ``trigger`` (``select`` / ``update`` also count column grants; ``select_columns_only`` /
    ``update_columns_only`` say when only some columns are granted), plus ``schema_usage`` and
    ``schema_create``. Read from ``has_table_privilege`` and friends (PostgreSQL "System Information
    Functions").
    """
    cur = await conn.execute(RELATIONS, {"role": role})
    out = []
    for (nsp, rel, rls, sel_t, sel_c, ins, upd_t, upd_c, dele, trunc, refs, trig, usage,
         create) in await cur.fetchall():
        out.append({
            "table": f"{nsp}.{rel}", "row_security": rls, "select": sel_c, "select_columns_only": sel_c and not sel_t,
            "insert": ins, "update": upd_c, "update_columns_only": upd_c and not upd_t, "delete": dele,
            "truncate": trunc, "references": refs, "trigger": trig, "schema_usage": usage, "schema_create": create,
        })
    return out


# --------------------------------------------------------------------------- the lesson in one call


async def compare_isolation(presets: Sequence[str | Any] = ("ledger", "full"), scenario: str = "refund", *,
                            seed: int = 0, url: str | None = None) -> list[dict]:
    """Run the cross-tenant fault (:func:`with_foreign_customer`) under each preset on one database and
    return one row per preset, read from the database and the provider.

    ``presets``: preset names or :class:`agentlab.core.safeguards.Safeguards` values (e.g.
    ``preset("full").replace(isolation=False, name="full without isolation")``); a row's ``preset`` is
    the value's name. The columns:

    ``preset``, ``isolation``, ``foreign_reply`` (the last answer to a call naming the other tenant's id),
    ``cross_tenant_effects`` (count of :func:`cross_tenant_effects` rows), ``effect_kinds``,
    ``own_final_credit_cents`` / ``own_intended_credit_cents`` (the thread's first customer),
    ``foreign_final_credit_cents`` / ``foreign_opening_credit_cents``, ``rollbacks``, ``error``.

    ``url``: an existing database; default a fresh one, dropped afterwards.
    """
    from langchain_core.messages import AIMessage, ToolMessage

    from agentlab.core.safeguards import preset as get_preset
    from agentlab.domains.billing.scenarios import get_scenario
    from agentlab.runtime.harness import Harness

    sc = with_foreign_customer(get_scenario(scenario))
    rows = []
    async with await Harness.open(url, purpose="tenancy") as h:
        for choice in presets:
            sg = get_preset(choice) if isinstance(choice, str) else choice
            name = sg.name
            ep = await h.run_episode(sc, sg, seed=seed)
            foreign_id = ep.customer_ids[-1]
            opening = {cid: spec.credit_cents for cid, spec in zip(ep.customer_ids, sc.customers)}
            async with h.pool.connection() as conn:
                effects = await cross_tenant_effects(conn, ep.schema, ep.tenant_id, ep.customer_ids,
                                                     messages=ep.messages, opening_credit_cents=opening)
                cur = await conn.execute(sql.SQL(CUSTOMER_TENANTS).format(schema=sql.Identifier(ep.schema)),
                                         {"ids": ep.customer_ids})
                credit = {cid: c for cid, _, c in await cur.fetchall()}
            replies = {m.tool_call_id: m for m in ep.messages if isinstance(m, ToolMessage)}
            foreign_replies = [str(replies[tc["id"]].content) for m in ep.messages if isinstance(m, AIMessage)
                               for tc in m.tool_calls
                               if tc["args"].get("customer_id") == foreign_id and tc["id"] in replies]
            rows.append({
                "preset": name, "isolation": sg.isolation,
                "foreign_reply": foreign_replies[-1] if foreign_replies else None,
                "cross_tenant_effects": len(effects), "effect_kinds": sorted({e.kind for e in effects}),
                "own_final_credit_cents": credit.get(ep.customer_ids[0]),
                "own_intended_credit_cents": sc.intended.final_credit_cents[0],
                "foreign_final_credit_cents": credit.get(foreign_id),
                "foreign_opening_credit_cents": sc.customers[-1].credit_cents,
                "rollbacks": ep.rollbacks_total, "error": ep.error,
            })
    return rows

