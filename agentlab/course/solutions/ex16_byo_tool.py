"""Notebook 16, exercise 16.1: your own invariant for the payout domain."""

PAYOUTS_AND_PAYMENTS = """
SELECT p.account_id, p.reference,
       (SELECT count(*) FROM provider.payments m
        WHERE m.reference = 'payout:' || p.account_id || ':' || p.reference) AS paid
FROM payouts.payout p WHERE p.account_id = ANY(%s) ORDER BY p.id
"""
PAID_WITHOUT_PAYOUT = """
SELECT m.reference, count(*) FROM provider.payments m
WHERE m.reference LIKE 'payout:%%' AND split_part(m.reference, ':', 2)::bigint = ANY(%s)
  AND NOT EXISTS (SELECT 1 FROM payouts.payout p
                  WHERE m.reference = 'payout:' || p.account_id || ':' || p.reference)
GROUP BY m.reference ORDER BY m.reference
"""


async def no_payout_without_its_intent(ctx) -> list[str]:
    """One line per payout of ``ctx.ids`` with 0 or 2+ payments at the provider, and per payment for a
    payout that is not recorded (paid inline by a batch that then rolled back)."""
    out = []
    cur = await ctx.conn.execute(PAYOUTS_AND_PAYMENTS, (ctx.ids,))
    for account, reference, paid in await cur.fetchall():
        if paid != 1:
            out.append(f"payout {reference} of account {account}: {paid} payments at the provider")
    cur = await ctx.conn.execute(PAID_WITHOUT_PAYOUT, (ctx.ids,))
    for reference, n in await cur.fetchall():
        out.append(f"{n} payment(s) under {reference}, which no payout row records")
    return out
