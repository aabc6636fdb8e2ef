"""tau2-bench's 16 retail tools (7 write) on PostgreSQL, with tau2's semantics.

Each tool is an argument model (pydantic, ``strict=True``, ``extra="forbid"``; field names are
tau2's argument names, so a golden action's ``arguments`` validate as they are; the JSON schema's
title is the tool's snake_case name) and an async handler
``handler(conn, args, ctx) -> dict | list | str``:

- ``conn`` is a ``psycopg.AsyncConnection`` already inside the caller's transaction or savepoint;
  a handler never commits. Tables are schema-qualified (``retail.``), whatever the ``search_path``.
- ``args`` is the validated arguments as a dict (``args_model.model_validate(raw).model_dump()``).
- ``ctx`` is the caller's context; only ``ctx.reproduce_last_variant_bug`` is read, when present.
- A refusal raises :class:`~agentlab.ToolError` (or :class:`~agentlab.NotFound`) with tau2's own
  message as the model-facing hint (``calculate`` words a malformed expression its own way); the
  caller rolls the call back, so a refused call has no effect (tau2 mutates its Python objects in
  place, but none of its refusals in these tools comes after a mutation that the data can reach:
  the payment methods it re-reads always exist here, by FK).
- Two of tau2's refusals are the schema's: a cancel reason other than tau2's two (the CHECK
  ``orders_cancel_reason_valid``) and an exchange's payment method the user does not have (the FOREIGN
  KEY ``orders_exchange_payment_method_owned``). The write raises psycopg's ``CheckViolation`` /
  ``ForeignKeyViolation``; the caller rolls it back and its translator gives the model tau2's words
  (:data:`agentlab.domains.retail.domain.ERROR_HINTS`). tau2 refuses them before any change, so does the
  port inside a transaction; without one, the statements before the refused one stay.
- The return value mirrors tau2's: the ``Order`` / ``User`` / ``Product`` / ``Variant`` JSON of
  :mod:`.export` (money as floats), a user id, or a text.

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

tau2's last-variant bug
-----------------------
In tau2's ``modify_pending_order_items`` the line that picks each item's new price and options uses
``variant``, the loop variable of the preceding check loop, so EVERY modified item gets the price and
options of the LAST replacement variant in ``new_item_ids`` (its ``item_id`` is right; its
``product_id`` and ``name`` stay). Nine items end with another product's price and options: 3 in
task 20, 1 in 21, 2 in 36, 2 in 37 and 1 in task 100 (action ``101_0``, two items of two products;
sierra-research/tau2-bench#317, #318; fix proposed in #322). tau2's gold states come from the same
code, so a port must reproduce the bug to match tau2's hashes:

- :data:`reproduce_last_variant_bug` (module level, default ``True``): reproduce it, matching tau2;
- ``False``: each item gets its own variant's price and options (the fix);
- a per-call override: ``ctx.reproduce_last_variant_bug`` when ``ctx`` has it and it is not None,
  or the SPECS of :func:`specs` built with a fixed setting.

The payment (or refund) recorded is the same either way: tau2 sums each pair's own prices.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from agentlab.core.errors import Category, NotFound, ToolError
from agentlab.domains.retail import queries as q  # the statements and the shared reads and locks
from agentlab.domains.retail.arguments import (
    Calculate,
    CancelPendingOrder,
    ExchangeDeliveredOrderItems,
    FindUserIdByEmail,
    FindUserIdByNameZip,
    GetItemDetails,
    GetOrderDetails,
    GetProductDetails,
    GetUserDetails,
    ListAllProductTypes,
    ModifyPendingOrderAddress,
    ModifyPendingOrderItems,
    ModifyPendingOrderPayment,
    ModifyUserAddress,
    ReturnDeliveredOrderItems,
    TransferToHumanAgents,
)
from agentlab.domains.retail.export import (
    fetch_order,
    fetch_product,
    fetch_user,
    money,
    variant_json,
)

reproduce_last_variant_bug: bool = True
"""Reproduce tau2's last-variant bug in ``modify_pending_order_items`` (see the module docstring)."""

CANCEL_REASONS = ("no longer needed", "ordered by mistake")

Handler = Callable[[psycopg.AsyncConnection, dict, Any], Awaitable["dict | list | str"]]



# --------------------------------------------------------------------------- calculate

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_POWER_BITS = 100_000  # refuse ints such as 9**9**9 that tau2's eval would spend minutes on


def _evaluate(node: ast.AST) -> Any:
    """The value Python's ``eval`` gives an arithmetic expression tree, without ``eval``."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) \
                and abs(left) > 1 and right * math.log2(abs(left)) > MAX_POWER_BITS:
            raise OverflowError("result too large")
        return _BINARY[type(node.op)](left, right)
    raise TypeError("not an arithmetic expression")


def calculate_expression(expression: str) -> str:
    """tau2's ``calculate``: the characters it allows, Python's arithmetic, ``str(round(float(x), 2))``."""
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ToolError("Invalid characters in expression", Category.INVALID_ARGUMENTS)
    try:
        value = _evaluate(ast.parse(expression, mode="eval").body)
        return str(round(float(value), 2))
    except ArithmeticError as exc:  # "division by zero", as tau2 says it
        raise ToolError(str(exc), Category.INVALID_ARGUMENTS) from None
    except (SyntaxError, TypeError, ValueError):
        raise ToolError("Invalid expression: use numbers, + - * /, parentheses and spaces",
                        Category.INVALID_ARGUMENTS) from None


# --------------------------------------------------------------------------- handlers: read and generic

async def calculate(conn, args, ctx) -> str:
    return calculate_expression(args["expression"])


async def find_user_id_by_name_zip(conn, args, ctx) -> str:
    # tau2 compares with Python's str.lower(), first match in the users' order: filter by zip in SQL,
    # compare names in Python, so the case folding is exactly tau2's
    first, last = args["first_name"].lower(), args["last_name"].lower()
    rows = await q.fetch_all(conn, "SELECT user_id, first_name, last_name FROM retail.users WHERE zip = %s "
                            "ORDER BY position", (args["zip"],))
    for user_id, first_name, last_name in rows:
        if first_name.lower() == first and last_name.lower() == last:
            return user_id
    raise NotFound("User not found")


async def find_user_id_by_email(conn, args, ctx) -> str:
    # tau2: the first user whose email.lower() equals the argument's .lower(). For an ASCII argument the
    # index on lower(email) finds the same user (PostgreSQL's lower() and Python's agree on ASCII, and
    # only an ASCII e-mail lowers to an ASCII text, the Kelvin sign aside); any other argument is compared
    # with Python's str.lower(), as tau2 does
    email = args["email"]
    if email.isascii():
        row = await q.fetch_one(conn, "SELECT user_id FROM retail.users WHERE lower(email) = lower(%s) "
                               "ORDER BY position LIMIT 1", (email,))
        if row is not None:
            return row[0]
    else:
        wanted = email.lower()
        for user_id, stored in await q.fetch_all(conn, "SELECT user_id, email FROM retail.users ORDER BY position", ()):
            if stored.lower() == wanted:
                return user_id
    raise NotFound("User not found")


async def get_order_details(conn, args, ctx) -> dict:
    order = await fetch_order(conn, args["order_id"])
    if order is None:
        raise NotFound("Order not found")
    return order


async def get_product_details(conn, args, ctx) -> dict:
    product = await fetch_product(conn, args["product_id"])
    if product is None:
        raise NotFound("Product not found")
    return product


async def get_item_details(conn, args, ctx) -> dict:
    row = await q.fetch_one(conn, "SELECT item_id, options, available, price_cents FROM retail.variants "
                           "WHERE item_id = %s", (args["item_id"],))
    if row is None:
        raise NotFound("Item not found")
    return variant_json(*row)


async def get_user_details(conn, args, ctx) -> dict:
    user = await fetch_user(conn, args["user_id"])
    if user is None:
        raise NotFound("User not found")
    return user


async def list_all_product_types(conn, args, ctx) -> str:
    rows = await q.fetch_all(conn, "SELECT name, product_id FROM retail.products ORDER BY position", ())
    return json.dumps({name: product_id for name, product_id in rows}, sort_keys=True)


async def transfer_to_human_agents(conn, args, ctx) -> str:
    return "Transfer successful"


# --------------------------------------------------------------------------- handlers: write

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


def _last_variant_bug(ctx) -> bool:
    value = getattr(ctx, "reproduce_last_variant_bug", None)
    return reproduce_last_variant_bug if value is None else bool(value)


async def modify_pending_order_items(conn, args, ctx) -> dict:
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
    bug = _last_variant_bug(ctx)
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


# --------------------------------------------------------------------------- registry

def _description(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


_TOOLS: tuple[tuple[str, type[BaseModel], Handler, bool], ...] = (
    ("calculate", Calculate, calculate, False),
    ("cancel_pending_order", CancelPendingOrder, cancel_pending_order, True),
    ("exchange_delivered_order_items", ExchangeDeliveredOrderItems, exchange_delivered_order_items, True),
    ("find_user_id_by_name_zip", FindUserIdByNameZip, find_user_id_by_name_zip, False),
    ("find_user_id_by_email", FindUserIdByEmail, find_user_id_by_email, False),
    ("get_order_details", GetOrderDetails, get_order_details, False),
    ("get_product_details", GetProductDetails, get_product_details, False),
    ("get_item_details", GetItemDetails, get_item_details, False),
    ("get_user_details", GetUserDetails, get_user_details, False),
    ("list_all_product_types", ListAllProductTypes, list_all_product_types, False),
    ("modify_pending_order_address", ModifyPendingOrderAddress, modify_pending_order_address, True),
    ("modify_pending_order_items", ModifyPendingOrderItems, modify_pending_order_items, True),
    ("modify_pending_order_payment", ModifyPendingOrderPayment, modify_pending_order_payment, True),
    ("modify_user_address", ModifyUserAddress, modify_user_address, True),
    ("return_delivered_order_items", ReturnDeliveredOrderItems, return_delivered_order_items, True),
    ("transfer_to_human_agents", TransferToHumanAgents, transfer_to_human_agents, False),
)

SPECS: list[tuple[str, type[BaseModel], Handler, bool, str]] = [
    (name, model, handler, writes, _description(model)) for name, model, handler, writes in _TOOLS
]
"""``(name, args_model, handler, writes, description)`` per tool, in the order tau2's RetailTools defines them."""

BY_NAME: dict[str, tuple[str, type[BaseModel], Handler, bool, str]] = {spec[0]: spec for spec in SPECS}
WRITE_TOOLS = frozenset(name for name, _m, _h, writes, _d in SPECS if writes)


def specs(reproduce_last_variant_bug: bool | None = None) -> list[tuple[str, type[BaseModel], Handler, bool, str]]:
    """:data:`SPECS`, with ``modify_pending_order_items`` fixed to one setting of the last-variant bug.

    ``None`` gives :data:`SPECS` itself (the module-level switch, read at call time).
    """
    if reproduce_last_variant_bug is None:
        return list(SPECS)
    setting = bool(reproduce_last_variant_bug)

    async def modify_items(conn, args, ctx) -> dict:
        return await modify_pending_order_items(conn, args, _WithBugSetting(ctx, setting))

    return [(name, model, modify_items if name == "modify_pending_order_items" else handler, writes, doc)
            for name, model, handler, writes, doc in SPECS]


class _WithBugSetting:
    """``ctx`` seen through, with ``reproduce_last_variant_bug`` set."""

    def __init__(self, ctx: Any, setting: bool):
        self._ctx, self.reproduce_last_variant_bug = ctx, setting

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def validate_args(name: str, args: dict) -> dict:
    """``args`` validated by the tool's model, as the dict a handler takes (raises ValidationError)."""
    return BY_NAME[name][1].model_validate(args).model_dump()


async def call(conn: psycopg.AsyncConnection, name: str, args: dict, ctx: Any = None) -> dict | list | str:
    """Validate ``args`` and run the tool's handler on ``conn`` (no transaction of its own)."""
    spec = BY_NAME.get(name)
    if spec is None:
        raise ToolError(f"Tool '{name}' not found.", Category.INVALID_ARGUMENTS)
    return await spec[2](conn, validate_args(name, args), ctx)


__all__ = [
    "SPECS", "BY_NAME", "WRITE_TOOLS", "CANCEL_REASONS", "reproduce_last_variant_bug", "specs", "call",
    "validate_args", "calculate_expression", "money",
] + [model.__name__ for _n, model, _h, _w in _TOOLS] + [handler.__name__ for _n, _m, handler, _w in _TOOLS]
