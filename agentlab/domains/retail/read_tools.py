"""The retail tools that only read (with ``calculate`` and ``transfer_to_human_agents``): their handlers.

Each is ``handler(conn, args, ctx)`` as :mod:`agentlab.domains.retail.tools` describes; none writes or
locks. A user is found the way tau2 finds one (first match in the users' order, names and e-mails
compared with Python's ``str.lower()``); an order, product, item or user is returned as tau2's JSON
(:mod:`.export`, money as floats); a missing one raises :class:`~agentlab.NotFound` with tau2's words.
"""

from __future__ import annotations

import json

from agentlab.core.errors import NotFound
from agentlab.domains.retail import queries as q  # the statements and the shared reads
from agentlab.domains.retail.calculator import calculate_expression
from agentlab.domains.retail.export import fetch_order, fetch_product, fetch_user, variant_json


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
