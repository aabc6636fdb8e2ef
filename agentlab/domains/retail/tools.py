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
- The return value mirrors tau2's: the ``Order`` / ``User`` / ``Product`` / ``Variant`` JSON of
  :mod:`.export` (money as floats), a user id, or a text.

The handlers live by kind: those that only read (with ``calculate`` and ``transfer_to_human_agents``)
in :mod:`.read_tools`, the seven that write, with their locks and their money in cents, in
:mod:`.write_tools`; ``calculate``'s arithmetic in :mod:`.calculator`. This module lists them
(:data:`SPECS`), validates and calls them (:func:`call`), and holds the last-variant bug's switch.

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

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from pydantic import BaseModel

from agentlab.core.errors import Category, ToolError
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
from agentlab.domains.retail.calculator import MAX_POWER_BITS, calculate_expression  # noqa: F401 (their home moved)
from agentlab.domains.retail.export import money  # noqa: F401 (in __all__)
from agentlab.domains.retail.read_tools import (  # their home moved; they stay importable here
    calculate,
    find_user_id_by_email,
    find_user_id_by_name_zip,
    get_item_details,
    get_order_details,
    get_product_details,
    get_user_details,
    list_all_product_types,
    transfer_to_human_agents,
)
from agentlab.domains.retail.write_tools import (  # their home moved; they stay importable here
    cancel_pending_order,
    exchange_delivered_order_items,
    modify_order_items,
    modify_pending_order_address,
    modify_pending_order_payment,
    modify_user_address,
    return_delivered_order_items,
)

reproduce_last_variant_bug: bool = True
"""Reproduce tau2's last-variant bug in ``modify_pending_order_items`` (see the module docstring)."""

CANCEL_REASONS = ("no longer needed", "ordered by mistake")

Handler = Callable[[psycopg.AsyncConnection, dict, Any], Awaitable["dict | list | str"]]


def _last_variant_bug(ctx) -> bool:
    value = getattr(ctx, "reproduce_last_variant_bug", None)
    return reproduce_last_variant_bug if value is None else bool(value)


async def modify_pending_order_items(conn, args, ctx) -> dict:
    """tau2's ``modify_pending_order_items`` (:func:`.write_tools.modify_order_items`), its last-variant bug
    reproduced as ``ctx.reproduce_last_variant_bug`` says, else as :data:`reproduce_last_variant_bug` does."""
    return await modify_order_items(conn, args, ctx, last_variant_bug=_last_variant_bug(ctx))


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
