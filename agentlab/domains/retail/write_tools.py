"""The seven retail tools that write: their handlers, each locking what it checks before it acts.

Each is ``handler(conn, args, ctx)`` as :mod:`agentlab.domains.retail.tools` describes (inside the
caller's transaction or savepoint; a refusal is rolled back by the caller) and returns the changed
order or user as tau2's JSON. ``modify_pending_order_items`` is :func:`modify_order_items` with the
last-variant bug's setting given: :mod:`.tools` decides it (``ctx`` or its module-level switch).

Two of tau2's refusals are the schema's: a cancel reason other than tau2's two (the CHECK
``orders_cancel_reason_valid``) and an exchange's payment method the user does not have (the FOREIGN
KEY ``orders_exchange_payment_method_owned``). The write raises psycopg's ``CheckViolation`` /
``ForeignKeyViolation``; the caller rolls it back and its translator gives the model tau2's words
(:data:`agentlab.domains.retail.domain.ERROR_HINTS`). tau2 refuses them before any change, so does the
port inside a transaction; without one, the statements before the refused one stay.

Check-then-act: every write tool locks the rows it checks before it acts, in one order (the
order row, then its items, then the variants it prices ``FOR SHARE``, then payment methods by id),
so two concurrent calls on the same order serialize and the second one sees the first one's
result: two concurrent identical cancels refund a gift card once, the second is refused. The order
row is the lock for its items, fulfillments and payment history (every tool that changes them
locks it first). A gift card's new balance is computed from the balance the tool read and written
as an absolute value (``SET balance_cents = %s``), as tau2's ``payment_method.balance += amount`` on a
loaded object does: correct under the row lock, a lost update without it.

The locks are a safeguard (``Safeguards.row_locks``, read from ``ctx.safeguards``; on when ``ctx``
carries none): switched off, every ``FOR UPDATE`` / ``FOR SHARE`` read is a plain ``SELECT``, the
straightforward port, and two conversations on one order or gift card race
(:mod:`agentlab.domains.retail.concurrency`, the concurrency fault family).

Money is integer cents. Where tau2 compares floats (``diff_price > 0``, ``balance < diff_price``) the
port compares exact cents; tau2's float sum in ``modify_pending_order_items`` is not rounded and can
only differ from the cents within ~1e-12 of a boundary (a zero difference, or a difference equal to a
gift card's balance), which no golden action reaches (114/114 tasks end in tau2's state).
"""

from __future__ import annotations

from psycopg.types.json import Jsonb

from agentlab.core.errors import Category, NotFound, ToolError
from agentlab.domains.retail import queries as q  # the statements and the shared reads and locks
from agentlab.domains.retail.export import fetch_order, fetch_user


async def cancel_pending_order(conn, args, ctx) -> dict:
    order_id, reason = args["order_id"], args["reason"]
    user_id, status = await q.lock_order(conn, order_id, ctx)
    if status != "pending":
        raise ToolError("Non-pending order cannot be cancelled", Category.BUSINESS_RULE)
    # the reason is the schema's to check: the CHECK orders_cancel_reason_valid refuses any but tau2's two
    # at the UPDATE below, and the translator words it as tau2 ("Invalid reason", retail's error hints)
    payments = await q.fetch_all(conn, q.PAYMENTS, (order_id,))
    methods = await q.lock_payment_methods(conn, user_id, [p[3] for p in payments], ctx)
    # tau2 refunds every entry of the history (a refund entry too) and credits gift cards at once
    refunds, credit = [], {}
    for _seq, _kind, amount, pm_id in payments:
        if pm_id not in methods:
            raise NotFound("Payment method not found")
        refunds.append(("refund", amount, pm_id))
        if methods[pm_id][0] == "gift_card":
            credit[pm_id] = credit.get(pm_id, 0) + amount
    for pm_id in sorted(credit):
        await conn.execute(q.SET_BALANCE, (methods[pm_id][1] + credit[pm_id], pm_id))
    await conn.execute(q.SET_STATUS_CANCELLED, (reason, order_id))
    await q.append_payments(conn, order_id, user_id, refunds)
    return await fetch_order(conn, order_id)


async def exchange_delivered_order_items(conn, args, ctx) -> dict:
    order_id, item_ids, new_item_ids = args["order_id"], list(args["item_ids"]), list(args["new_item_ids"])
    pm_id = args["payment_method_id"]
    user_id, status = await q.lock_order(conn, order_id, ctx)
    if status != "delivered":
        raise ToolError("Non-delivered order cannot be exchanged", Category.BUSINESS_RULE)
    items = await q.fetch_all(conn, q.ORDER_ITEM_IDS, (order_id,))
    q.count_check(item_ids, [i[0] for i in items], lambda item_id: f"Number of {item_id} not found.")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match.", Category.INVALID_ARGUMENTS)
    diff = 0
    for item_id, new_item_id in zip(item_ids, new_item_ids):
        item = next((i for i in items if i[0] == item_id), None)
        if item is None:
            raise NotFound(f"Item {item_id} not found")
        available, new_price, _options = await q.variant(conn, item[1], new_item_id, ctx)
        if not available:
            raise ToolError(f"New item {new_item_id} not found or available", Category.BUSINESS_RULE)
        diff += new_price - item[2]
    # a payment method the user does not have is the schema's to refuse: the FOREIGN KEY
    # orders_exchange_payment_method_owned at the UPDATE below ("Payment method not found", as tau2)
    source, balance = (await q.lock_payment_methods(conn, user_id, [pm_id], ctx)).get(pm_id, (None, None))
    if source == "gift_card" and balance < diff:
        raise ToolError("Insufficient gift card balance to pay for the price difference", Category.BUSINESS_RULE)
    await conn.execute(q.SET_STATUS_EXCHANGE, (sorted(item_ids), sorted(new_item_ids), pm_id, diff, order_id))
    return await fetch_order(conn, order_id)


async def modify_pending_order_address(conn, args, ctx) -> dict:
    order_id = args["order_id"]
    _user_id, status = await q.lock_order(conn, order_id, ctx)
    if "pending" not in status:  # tau2's _is_pending_order: 'pending (item modified)' too
        raise ToolError("Non-pending order cannot be modified", Category.BUSINESS_RULE)
    await conn.execute(q.SET_ORDER_ADDRESS, (args["address1"], args["address2"], args["city"], args["state"],
                                           args["country"], args["zip"], order_id))
    return await fetch_order(conn, order_id)


async def modify_order_items(conn, args, ctx, *, last_variant_bug: bool) -> dict:
    """tau2's ``modify_pending_order_items``; ``last_variant_bug`` True gives every modified item the price
    and options of the last replacement variant, as tau2 does (:mod:`.tools` says why), False its own."""
    order_id, item_ids, new_item_ids = args["order_id"], list(args["item_ids"]), list(args["new_item_ids"])
    pm_id = args["payment_method_id"]
    user_id, status = await q.lock_order(conn, order_id, ctx)
    if status != "pending":
        raise ToolError("Non-pending order cannot be modified", Category.BUSINESS_RULE)
    # the order's items as tau2 holds them: [position, item_id, product_id, price_cents, options]
    items = [list(row) for row in await q.fetch_all(conn, q.ORDER_ITEMS_FOR_UPDATE if q.locking(ctx) else q.ORDER_ITEMS_READ,
                                               (order_id,))]
    q.count_check(item_ids, [i[1] for i in items], lambda item_id: f"{item_id} not found")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match", Category.INVALID_ARGUMENTS)
    diff, variants = 0, []
    for item_id, new_item_id in zip(item_ids, new_item_ids):
        if item_id == new_item_id:
            raise ToolError("The new item id should be different from the old item id", Category.INVALID_ARGUMENTS)
        item = next((i for i in items if i[1] == item_id), None)
        if item is None:
            raise NotFound(f"Item {item_id} not found")
        available, new_price, options = await q.variant(conn, item[2], new_item_id, ctx)
        if not available:
            raise ToolError(f"New item {new_item_id} not found or available", Category.BUSINESS_RULE)
        diff += new_price - item[3]
        variants.append((new_price, options))
    source, balance = await q.payment_method(conn, user_id, pm_id, lock=True, ctx=ctx)
    if source == "gift_card" and balance < diff:
        raise ToolError("Insufficient gift card balance to pay for the new item", Category.BUSINESS_RULE)
    await q.append_payments(conn, order_id, user_id, [("payment" if diff > 0 else "refund", abs(diff), pm_id)])
    if source == "gift_card":
        await conn.execute(q.SET_BALANCE, (balance - diff, pm_id))
    bug = last_variant_bug
    changed: dict[int, list] = {}
    for (item_id, new_item_id), own in zip(zip(item_ids, new_item_ids), variants):
        # tau2 looks each old id up again among the items as they are now (an item changed by an
        # earlier pair no longer carries its old id), and assigns the price and options of `variant`
        item = next(i for i in items if i[1] == item_id)
        price, options = variants[-1] if bug else own
        item[1], item[3], item[4] = new_item_id, price, options
        changed[item[0]] = item
    async with conn.cursor() as cur:
        await cur.executemany(
            "UPDATE retail.order_items SET item_id = %s, price_cents = %s, options = %s "
            "WHERE order_id = %s AND position = %s",
            [(i[1], i[3], Jsonb(i[4]), order_id, i[0]) for i in changed.values()])
    await conn.execute(q.SET_STATUS_ITEM_MODIFIED, (order_id,))
    return await fetch_order(conn, order_id)


async def modify_pending_order_payment(conn, args, ctx) -> dict:
    order_id, pm_id = args["order_id"], args["payment_method_id"]
    user_id, status = await q.lock_order(conn, order_id, ctx)
    if "pending" not in status:
        raise ToolError("Non-pending order cannot be modified", Category.BUSINESS_RULE)
    await q.payment_method(conn, user_id, pm_id, lock=False)  # NotFound first, as tau2
    payments = await q.fetch_all(conn, q.PAYMENTS, (order_id,))
    if len(payments) != 1 or payments[0][1] != "payment":
        raise ToolError("There should be exactly one payment for a pending order", Category.BUSINESS_RULE)
    old_pm, amount = payments[0][3], payments[0][2]
    if old_pm == pm_id:
        raise ToolError("The new payment method should be different from the current one",
                        Category.INVALID_ARGUMENTS)
    methods = await q.lock_payment_methods(conn, user_id, [pm_id, old_pm], ctx)
    if old_pm not in methods:
        raise NotFound("Payment method not found")
    source, balance = methods[pm_id]
    if source == "gift_card" and balance < amount:
        raise ToolError("Insufficient gift card balance to pay for the order", Category.BUSINESS_RULE)
    await q.append_payments(conn, order_id, user_id, [("payment", amount, pm_id), ("refund", amount, old_pm)])
    if source == "gift_card":
        await conn.execute(q.SET_BALANCE, (balance - amount, pm_id))
    if methods[old_pm][0] == "gift_card":
        await conn.execute(q.SET_BALANCE, (methods[old_pm][1] + amount, old_pm))
    return await fetch_order(conn, order_id)


async def modify_user_address(conn, args, ctx) -> dict:
    user_id = args["user_id"]
    if await q.fetch_one(conn, q.USER_FOR_UPDATE if q.locking(ctx) else q.USER_READ, (user_id,)) is None:
        raise NotFound("User not found")
    await conn.execute(q.SET_USER_ADDRESS, (args["address1"], args["address2"], args["city"], args["state"],
                                          args["country"], args["zip"], user_id))
    return await fetch_user(conn, user_id)


async def return_delivered_order_items(conn, args, ctx) -> dict:
    order_id, item_ids, pm_id = args["order_id"], list(args["item_ids"]), args["payment_method_id"]
    user_id, status = await q.lock_order(conn, order_id, ctx)
    if status != "delivered":
        raise ToolError("Non-delivered order cannot be returned", Category.BUSINESS_RULE)
    source, _balance = await q.payment_method(conn, user_id, pm_id, lock=True, ctx=ctx)
    payments = await q.fetch_all(conn, q.PAYMENTS, (order_id,))
    if source != "gift_card" and (not payments or pm_id != payments[0][3]):
        raise ToolError("Payment method should be the original payment method", Category.BUSINESS_RULE)
    items = await q.fetch_all(conn, q.ORDER_ITEM_IDS, (order_id,))
    q.count_check(item_ids, [i[0] for i in items], lambda _item_id: "Some item not found")
    await conn.execute(q.SET_STATUS_RETURN, (sorted(item_ids), pm_id, order_id))
    return await fetch_order(conn, order_id)

