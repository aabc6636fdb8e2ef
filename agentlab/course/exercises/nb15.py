"""Exercises of notebook 15 (least privilege and tenant isolation): who sees a customer, silent or loud."""

from __future__ import annotations

from agentlab.course.exercises import Case, Exercise

TENANTS = ("acme", "globex", "initech", "umbrella")

EXERCISES = (
    Exercise(
        id="15.1", title="Who sees a customer?", function="who_sees",
        solution="agentlab.course.solutions.ex15_tenancy:who_sees",
        cases=tuple(Case(args=(customer,), expected={t: t == owner for t in TENANTS})
                    for customer, owner in ((1, "acme"), (3, "globex"), (5, "initech"), (6, "umbrella"))),
        hints={
            "*": "async with h.pool.connection() as conn: for each tenant, (await try_as_agent(conn, "
                 "'SELECT id FROM customers WHERE id = %s', (customer_id,), tenant_id=tenant)).rows == 1",
        },
    ),
    Exercise(
        id="15.2", title="Silent or loud?", function="write_as",
        solution="agentlab.course.solutions.ex15_tenancy:write_as",
        cases=(
            Case(args=("acme", 3, "globex"), expected={"update_credit": 0, "memo_like_the_tools": 0,
                                                       "memo_naming_its_tenant": "42501"}),
            Case(args=("globex", 3, "globex"), expected={"update_credit": 1, "memo_like_the_tools": 1,
                                                         "memo_naming_its_tenant": 1}),
        ),
        hints={
            "update_credit": "UPDATE customers SET credit_cents = credit_cents - 100 WHERE id = %s: a hidden row is "
                             "not there, 0 rows",
            "memo_like_the_tools": "INSERT INTO credit_memos (tenant_id, customer_id, ...) SELECT tenant_id, id, ... "
                                   "FROM customers WHERE id = %s: the SELECT sees no hidden row",
            "memo_naming_its_tenant": "INSERT ... VALUES (customer_tenant, ...): WITH CHECK refuses a row of another "
                                      "tenant, SQLSTATE 42501",
            "*": "each write through try_as_agent(conn, sql, params, tenant_id=tenant_id): the probe's .rows, or "
                 ".sqlstate when .refused",
        },
    ),
)
