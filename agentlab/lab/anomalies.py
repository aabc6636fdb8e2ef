"""The isolation matrix of notebook 18: each concurrency anomaly at each isolation level, without and
with row locks, in numbers read from the database.

Sources: PostgreSQL docs "Transaction Isolation", "Explicit Locking"; wiki "Serializable Snapshot Isolation".
"""

from __future__ import annotations

from psycopg import sql

from agentlab.lab.runner import Lab

MATRIX_FAULTS = ("lost_update", "check_then_act", "write_skew")
# per fault: what to read from the database, and the value both conversations together should leave
MEASURES = {
    "lost_update": ("final credit (cents)", "SELECT credit_cents FROM {s}.customers WHERE id = %s", 1500),
    "check_then_act": ("credit redeemed (cents)",
                       "SELECT coalesce(sum(amount_cents), 0) FROM limits.credit_redemptions WHERE customer_id = %s", 3000),
    "write_skew": ("refunded today (cents)",
                   "SELECT coalesce(sum(amount_cents), 0) FROM {s}.refunds WHERE customer_id = %s", 3000),
}
RETRIES = "SELECT count(*) FROM events WHERE thread_id = ANY(%s) AND outcome = 'infrastructure_error' AND sqlstate = %s"


def isolation_settings(base=None) -> list:
    """``base`` (default ``full``) at each isolation level, without and with row locks: six Safeguards values,
    named ``"<level>"`` and ``"<level> + row locks"``."""
    from agentlab.core.safeguards import ISOLATION_LEVELS, preset

    base = base or preset("full")
    return [base.replace(isolation_level=level, row_locks=locks, name=level + (" + row locks" if locks else ""))
            for locks in (False, True) for level in ISOLATION_LEVELS]


async def isolation_matrix(harness, *, faults=MATRIX_FAULTS, settings=None, seed: int = 0):
    """One episode of each fault under each setting (:func:`isolation_settings`), in numbers read from the
    database: a pandas DataFrame with one row per (fault, setting): ``fault``, ``setting``, ``isolation_level``,
    ``row_locks``, ``measure`` (what was read), ``value``, ``intended``, ``serialization_failures`` (batches
    refused with 40001 and retried by the graph), ``violations`` (the invariant checker's count) and ``kinds``."""
    import pandas as pd

    rows = []
    async with Lab(harness) as lab:
        for name in faults:
            measure, query, intended = MEASURES[name]
            for sg in settings or isolation_settings():
                run = await lab.run(name, sg, seed=seed)
                await harness.events.flush()
                q = sql.SQL(query).format(s=sql.Identifier(sg.schema))
                async with harness.pool.connection() as conn:
                    (value,) = await (await conn.execute(q, (run.episode.customer_ids[0],))).fetchone()
                    (failures,) = await (await conn.execute(RETRIES, (run.notes["threads"], "40001"))).fetchone()
                rows.append({"fault": name, "setting": sg.name, "isolation_level": sg.isolation_level,
                             "row_locks": sg.row_locks, "measure": measure, "value": value, "intended": intended,
                             "serialization_failures": failures, "violations": len(run.violations),
                             "kinds": ", ".join(sorted({v.kind for v in run.violations}))})
    return pd.DataFrame(rows)
