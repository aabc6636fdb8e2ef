"""Exercises of notebook 18 (two conversations, one row)."""

from __future__ import annotations

from psycopg import sql


def settings_that_hold(matrix) -> list[str]:
    """Exercise 18.1: the settings of ``matrix`` (:func:`agentlab.lab.anomalies.isolation_matrix`) under which
    every fault left the intended value and no violation, in the matrix's order."""
    ok = matrix.assign(held=(matrix["value"] == matrix["intended"]) & (matrix["violations"] == 0))
    held = ok.groupby("setting", sort=False)["held"].all()
    return [s for s, h in held.items() if h]


async def redeem_twice(h, setting, *, seed: int = 0) -> dict:
    """Exercise 18.2: the ``lost_update`` fault once under ``setting`` (a Safeguards value); what the database
    holds for its customer: ``credit_cents``, ``redemptions`` (rows) and ``redeemed_cents`` (their sum)."""
    from agentlab import Lab

    async with Lab(h) as lab:
        run = await lab.run("lost_update", setting, seed=seed)
    cid = run.episode.customer_ids[0]
    frame = await h.df(sql.SQL(
        "SELECT c.credit_cents, count(r.id) AS redemptions, coalesce(sum(r.amount_cents), 0) AS redeemed_cents "
        "FROM {s}.customers c LEFT JOIN limits.credit_redemptions r ON r.customer_id = c.id "
        "WHERE c.id = %s GROUP BY c.credit_cents").format(s=sql.Identifier(setting.schema)), (cid,))
    return {k: int(v) for k, v in frame.iloc[0].items()}
