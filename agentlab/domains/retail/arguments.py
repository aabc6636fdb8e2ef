"""The retail tools' argument models: strict pydantic models, one per tool, with tau2's own descriptions
(:mod:`agentlab.domains.retail.tools` declares the tools on them).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


def _config(tool_name: str) -> ConfigDict:
    return ConfigDict(strict=True, extra="forbid", title=tool_name)


OrderId = Field(description="The order id, such as '#W0000000'; it starts with a '#'.")
UserId = Field(description="The user id, such as 'sara_doe_496'.")
ProductId = Field(description="The product id, such as '6086499569'; not the same thing as an item id.")
ItemId = Field(description="The item id, such as '6086499569'; not the same thing as a product id.")
PaymentMethodId = Field(description=(
    "The payment method id, such as 'gift_card_0000000' or 'credit_card_0000000', as shown in the "
    "user's or the order's details; it pays or receives the price difference."))
Address1 = Field(description="The first line of the address, such as '123 Main St'.")
Address2 = Field(description="The second line of the address, such as 'Apt 1', or ''.")
City = Field(description="The city, such as 'San Francisco'.")
State = Field(description="The state, such as 'CA'.")
Country = Field(description="The country, such as 'USA'.")
Zip = Field(description="The zip code, such as '12345'.")


class Calculate(BaseModel):
    """Calculate the result of an arithmetic expression of numbers, + - * /, parentheses and spaces; the
    result is rounded to 2 decimals."""

    model_config = _config("calculate")
    expression: str = Field(description="The expression to calculate, such as '2 + 2'.")


class CancelPendingOrder(BaseModel):
    """Cancel a pending order; a processed or delivered order cannot be cancelled. Explain the
    cancellation to the user and get an explicit yes before calling. The order becomes 'cancelled' and
    every payment is refunded: at once to a gift card, in 5-7 business days to other methods. Returns
    the order after the cancellation."""

    model_config = _config("cancel_pending_order")
    order_id: str = OrderId
    reason: str = Field(description="Why: either 'no longer needed' or 'ordered by mistake'.")


class ExchangeDeliveredOrderItems(BaseModel):
    """Exchange items of a delivered order for other items of the same product. A delivered order can
    be returned or exchanged once only. Explain the exchange to the user and get an explicit yes before
    calling. Returns the order after the exchange request."""

    model_config = _config("exchange_delivered_order_items")
    order_id: str = OrderId
    item_ids: list[str] = Field(description=(
        "The item ids to exchange, each such as '1008292230'; an id may appear more than once."))
    new_item_ids: list[str] = Field(description=(
        "The item ids to exchange them for, each such as '1008292230', one per item id in the same "
        "position and of the same product; an id may appear more than once."))
    payment_method_id: str = PaymentMethodId


class FindUserIdByNameZip(BaseModel):
    """Find a user id from first name, last name and zip code. Look users up by e-mail first; use this
    only when the user is not found by e-mail or does not remember it. Returns the user id."""

    model_config = _config("find_user_id_by_name_zip")
    first_name: str = Field(description="The customer's first name, such as 'John'.")
    last_name: str = Field(description="The customer's last name, such as 'Doe'.")
    zip: str = Zip


class FindUserIdByEmail(BaseModel):
    """Find a user id from an e-mail address. Returns the user id."""

    model_config = _config("find_user_id_by_email")
    email: str = Field(description="The user's e-mail, such as 'something@example.com'.")


class GetOrderDetails(BaseModel):
    """Get the status and details of an order."""

    model_config = _config("get_order_details")
    order_id: str = OrderId


class GetProductDetails(BaseModel):
    """Get the inventory details of a product: its variants (items) with options, availability, price."""

    model_config = _config("get_product_details")
    product_id: str = ProductId


class GetItemDetails(BaseModel):
    """Get the inventory details of one item: its options, availability and price."""

    model_config = _config("get_item_details")
    item_id: str = ItemId


class GetUserDetails(BaseModel):
    """Get the details of a user: name, address, e-mail, payment methods and orders."""

    model_config = _config("get_user_details")
    user_id: str = UserId


class ListAllProductTypes(BaseModel):
    """List the name and product id of every product type (50 in the store; each has several items with
    their own item ids and options). Returns a JSON object of product names to product ids, by name."""

    model_config = _config("list_all_product_types")


class ModifyPendingOrderAddress(BaseModel):
    """Change the shipping address of a pending order. Explain the change to the user and get an
    explicit yes before calling. Returns the order after the change."""

    model_config = _config("modify_pending_order_address")
    order_id: str = OrderId
    address1: str = Address1
    address2: str = Address2
    city: str = City
    state: str = State
    country: str = Country
    zip: str = Zip


class ModifyPendingOrderItems(BaseModel):
    """Change items of a pending order to other items of the same product. This can be done once per
    pending order. Explain the change to the user and get an explicit yes before calling. Returns the
    order after the change."""

    model_config = _config("modify_pending_order_items")
    order_id: str = OrderId
    item_ids: list[str] = Field(description=(
        "The item ids to change, each such as '1008292230'; an id may appear more than once."))
    new_item_ids: list[str] = Field(description=(
        "The item ids to change them to, each such as '1008292230', one per item id in the same "
        "position, of the same product and different from it; an id may appear more than once."))
    payment_method_id: str = PaymentMethodId


class ModifyPendingOrderPayment(BaseModel):
    """Change the payment method of a pending order. Explain the change to the user and get an explicit
    yes before calling. Returns the order after the change."""

    model_config = _config("modify_pending_order_payment")
    order_id: str = OrderId
    payment_method_id: str = Field(description=(
        "The new payment method id, such as 'gift_card_0000000' or 'credit_card_0000000', as shown in "
        "the user's details."))


class ModifyUserAddress(BaseModel):
    """Change a user's default address. Explain the change to the user and get an explicit yes before
    calling. Returns the user after the change."""

    model_config = _config("modify_user_address")
    user_id: str = UserId
    address1: str = Address1
    address2: str = Address2
    city: str = City
    state: str = State
    country: str = Country
    zip: str = Zip


class ReturnDeliveredOrderItems(BaseModel):
    """Return items of a delivered order; the order becomes 'return requested' and the user gets an
    e-mail on how and where to send the items. Explain the return to the user and get an explicit yes
    before calling. Returns the order after the return request."""

    model_config = _config("return_delivered_order_items")
    order_id: str = OrderId
    item_ids: list[str] = Field(description=(
        "The item ids to return, each such as '1008292230'; an id may appear more than once."))
    payment_method_id: str = Field(description=(
        "Where the refund goes: the order's original payment method or a gift card of the user, such as "
        "'gift_card_0000000' or 'credit_card_0000000'."))


class TransferToHumanAgents(BaseModel):
    """Transfer the user to a human agent with a summary of the issue. Transfer only when the user
    asks for a human agent explicitly, or when the policy and the tools cannot solve the issue."""

    model_config = _config("transfer_to_human_agents")
    summary: str = Field(description="A summary of the user's issue.")
