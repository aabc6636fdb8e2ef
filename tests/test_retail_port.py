"""The tau2-bench retail port: schema, COPY load, export, the 16 tools, against tau2's own end states.

The ground truth is ``data/retail/expected_hashes.json``, written by ``scripts/tau2_expected_hashes.py``
from tau2's reference code: per task the canonical hash of tau2's end state (floats rounded to 2
decimals), the golden actions that raised and the hash of what each action returned.

A sample of 13 tasks is replayed here, each on a fresh database, every golden action in its own
transaction. All 114: ``RETAIL_FULL=1 pytest tests/test_retail_port.py`` (20 s to 2 min, with the machine's load) or
``python scripts/retail_replay_check.py``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from types import SimpleNamespace

import psycopg
import pytest
from pydantic import ValidationError

from agentlab import NotFound, ToolError, create_database, drop_database, find_leaks
from agentlab.domains.retail import tools
from agentlab.domains.retail.export import canonical_hash, export_state, export_state_sync, round_floats
from agentlab.domains.retail.load import (
    create_schema,
    create_schema_sync,
    load,
    load_sync,
    read_db_json,
    read_expected_hashes,
    read_tasks,
    table_rows,
)
from agentlab.domains.retail.replay import check_tasks

EXPECTED = read_expected_hashes()
TASKS = {t["id"]: t for t in read_tasks()}
DB_JSON = read_db_json()

BUG_TASKS = ["20", "21", "36", "37", "100"]  # modify_pending_order_items with items of several products
SAMPLE = BUG_TASKS + [
    "2",    # get_product_details of a product id that does not exist (refused)
    "46",   # two get_order_details of orders that do not exist (refused)
    "64",   # exchange on an order that is not delivered (refused), among other writes
    "105",  # exchange refused: insufficient gift card balance
    "40",   # modify_pending_order_payment
    "16",   # two cancels and a return
    "22",   # modify_user_address twice and modify_pending_order_address
    "0",    # exchange of two items
]


def actions(task_id: str) -> list[dict]:
    return TASKS[task_id]["evaluation_criteria"]["actions"]


async def connect_loaded(url: str) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    async with conn.transaction():
        await create_schema(conn)
    await load(conn, DB_JSON)
    return conn


@pytest.fixture
async def retail(database_url):
    """An autocommit connection to a fresh database holding schema retail loaded with db.json."""
    conn = await connect_loaded(database_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def loaded_url():
    """One database loaded with db.json (by load_sync) for the tests that change nothing they keep."""
    url = create_database("retail")
    try:
        with psycopg.connect(url) as conn:
            create_schema_sync(conn)
            load_sync(conn, DB_JSON)
            conn.commit()
        yield url
    finally:
        drop_database(url)


@pytest.fixture
async def shared(loaded_url):
    """A connection to the module's loaded database, inside a transaction that is always rolled back
    (so a test's ``conn.transaction()`` is a savepoint and nothing it does outlives it)."""
    conn = await psycopg.AsyncConnection.connect(loaded_url, autocommit=True)
    try:
        async with conn.transaction(force_rollback=True):
            yield conn
    finally:
        await conn.close()


async def scalar(conn, query: str, params=()):
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    return None if row is None else row[0]


# --------------------------------------------------------------------------- data, load and export

def tau2_shape(db_json: dict) -> dict:
    """db.json as tau2's model_dump() gives it: the optional order fields present, as None."""
    state = copy.deepcopy(db_json)
    for order in state["orders"].values():
        for key in ("cancel_reason", "exchange_items", "exchange_new_items", "exchange_payment_method_id",
                    "exchange_price_difference", "return_items", "return_payment_method_id"):
            order.setdefault(key, None)
    return state


async def test_initial_export_is_tau2s_initial_state(retail):
    state = await export_state(retail)
    assert canonical_hash(state) == EXPECTED["initial_hash"]
    assert state == tau2_shape(DB_JSON)  # every key, every list in order
    for part in ("products", "users", "orders"):  # and the dicts in db.json's order
        assert list(state[part]) == list(DB_JSON[part])
    assert [list(u["orders"]) for u in state["users"].values()] == [u["orders"] for u in DB_JSON["users"].values()]
    counts = {t: await scalar(retail, f"SELECT count(*) FROM retail.{t}") for t in (
        "products", "variants", "users", "payment_methods", "orders", "order_items", "fulfillments",
        "payment_history")}
    assert counts == {"products": 50, "variants": 591, "users": 500, "payment_methods": 695, "orders": 1000,
                      "order_items": 2978, "fulfillments": 577, "payment_history": 1102}
    assert await scalar(retail, "SELECT sum(balance_cents) FROM retail.payment_methods") == 1_234_800


def test_sync_load_and_export(database_url):
    with psycopg.connect(database_url) as conn:
        create_schema_sync(conn)
        load_sync(conn, DB_JSON)
        conn.commit()
        assert canonical_hash(export_state_sync(conn)) == EXPECTED["initial_hash"]


def test_canonical_hash_rounds_floats_only():
    assert canonical_hash({"a": [17.98999999999998]}) == canonical_hash({"a": [17.99]})
    assert canonical_hash({"a": 17.98}) != canonical_hash({"a": 17.99})
    assert round_floats({"x": (1.005, "1.005", 2, True, None)}) == {"x": [round(1.005, 2), "1.005", 2, True, None]}
    assert canonical_hash({"a": round(-1e-15, 2)}) == canonical_hash({"a": 0.0})  # -0.0 is 0.0


def test_load_refuses_money_it_could_not_give_back():
    bad = copy.deepcopy(DB_JSON)
    next(iter(bad["orders"].values()))["payment_history"][0]["amount"] = 17.98999999999998
    with pytest.raises(ValueError, match="whole number of cents"):
        table_rows(bad)


# --------------------------------------------------------------------------- the golden actions

@pytest.mark.parametrize("task_id", SAMPLE)
async def test_golden_actions_end_in_tau2s_state(task_id):
    """A fresh database; each golden action in its own transaction; tau2's end state, refusals, returns."""
    url = create_database("retail")
    try:
        conn = await connect_loaded(url)
        try:
            expected_raised = {r["action_id"]: r["error"] for r in EXPECTED["raised"].get(task_id, [])}
            raised = {}
            for action, want_result in zip(actions(task_id), EXPECTED["result_hashes"][task_id]):
                before = canonical_hash(await export_state(conn)) if action["action_id"] in expected_raised else None
                try:
                    async with conn.transaction():
                        result = await tools.call(conn, action["name"], action["arguments"])
                except Exception as exc:  # noqa: BLE001 - swallowed, as tau2's evaluator does
                    raised[action["action_id"]] = exc
                    assert want_result is None, f"{action['action_id']} refused by the port, not by tau2: {exc}"
                    assert isinstance(exc, ToolError), f"{action['action_id']} raised {exc!r}, not a refusal"
                    assert find_leaks(exc.hint) == []
                    # the same message as tau2's ValueError, and no effect
                    assert f"ValueError: {exc.hint}" == expected_raised[action["action_id"]]
                    assert canonical_hash(await export_state(conn)) == before
                else:
                    assert canonical_hash(result) == want_result, f"{action['action_id']} returned {result!r}"
            assert sorted(raised) == sorted(expected_raised)
            assert canonical_hash(await export_state(conn)) == EXPECTED["hashes"][task_id]
        finally:
            await conn.close()
    finally:
        drop_database(url)


async def test_check_tasks_rolls_each_task_back(shared):
    report = await check_tasks(shared, ["20", "46", "105"])
    assert report.mismatched == [], report.summary()
    assert canonical_hash(await export_state(shared)) == EXPECTED["initial_hash"]


@pytest.mark.skipif(not os.environ.get("RETAIL_FULL"), reason="all 114 tasks take 20 s or more: set RETAIL_FULL=1")
async def test_all_114_tasks_match(shared):
    report = await check_tasks(shared)
    print(report.summary())
    assert report.matched == 114, report.summary()


# --------------------------------------------------------------------------- tau2's last-variant bug

async def item_prices_off_their_variant(conn) -> int:
    return await scalar(conn, "SELECT count(*) FROM retail.order_items i JOIN retail.variants v USING (item_id) "
                              "WHERE i.price_cents <> v.price_cents OR i.options <> v.options")


async def replay_in_savepoints(conn, task_id: str, ctx=None, modify_items=None) -> None:
    for action in actions(task_id):
        try:
            async with conn.transaction():
                if modify_items is not None and action["name"] == "modify_pending_order_items":
                    await modify_items(conn, tools.validate_args(action["name"], action["arguments"]), ctx)
                else:
                    await tools.call(conn, action["name"], action["arguments"], ctx)
        except ToolError:
            pass


async def test_last_variant_bug_reproduced_by_default_fixed_on_request(shared):
    """tau2's bug leaves 9 items in 5 tasks priced by another product; fixed, none, and the states differ."""
    bug_items = {"20": 3, "21": 1, "36": 2, "37": 2, "100": 1}
    assert tools.reproduce_last_variant_bug is True
    for task_id, n_items in bug_items.items():
        async with shared.transaction(force_rollback=True):
            await replay_in_savepoints(shared, task_id)
            assert await item_prices_off_their_variant(shared) == n_items
            assert canonical_hash(await export_state(shared)) == EXPECTED["hashes"][task_id]
        async with shared.transaction(force_rollback=True):
            await replay_in_savepoints(shared, task_id, SimpleNamespace(reproduce_last_variant_bug=False))
            assert await item_prices_off_their_variant(shared) == 0  # each item priced by its own variant
            assert canonical_hash(await export_state(shared)) != EXPECTED["hashes"][task_id]


@pytest.mark.parametrize("how", ["module", "specs"])
async def test_last_variant_bug_other_switches(shared, how, monkeypatch):
    modify_items = None
    if how == "module":
        monkeypatch.setattr(tools, "reproduce_last_variant_bug", False)
    else:
        modify_items = {s[0]: s[2] for s in tools.specs(False)}["modify_pending_order_items"]
    async with shared.transaction(force_rollback=True):
        await replay_in_savepoints(shared, "20", None, modify_items)
        assert await item_prices_off_their_variant(shared) == 0
    # a ctx that says True wins over the module-level False
    async with shared.transaction(force_rollback=True):
        await replay_in_savepoints(shared, "20", SimpleNamespace(reproduce_last_variant_bug=True),
                                   modify_items if how == "module" else None)
        assert await item_prices_off_their_variant(shared) == 3


# --------------------------------------------------------------------------- specs and argument models

def test_specs_are_tau2s_tools():
    assert sorted(s[0] for s in tools.SPECS) == sorted(EXPECTED["tools"])
    assert {s[0] for s in tools.SPECS if s[3]} == {n for n, kind in EXPECTED["tools"].items() if kind == "write"}
    assert len(tools.SPECS) == 16 and len(tools.WRITE_TOOLS) == 7
    for name, model, handler, _writes, description in tools.SPECS:
        assert model.model_json_schema()["title"] == name
        assert model.model_config["strict"] and model.model_config["extra"] == "forbid"
        assert asyncio.iscoroutinefunction(handler) and description
        assert find_leaks(description) == []


def test_every_golden_action_validates_as_is():
    n = 0
    for task in TASKS.values():
        for action in task["evaluation_criteria"]["actions"]:
            assert tools.validate_args(action["name"], action["arguments"]) == action["arguments"]
            n += 1
    assert n == 550


@pytest.mark.parametrize("args", [
    {"order_id": "#W2378156", "item_ids": "1151293680", "payment_method_id": "credit_card_9513926"},
    {"order_id": "#W2378156", "item_ids": [1151293680], "payment_method_id": "credit_card_9513926"},
    {"order_id": "#W2378156", "item_ids": ["1151293680"], "payment_method_id": "credit_card_9513926", "x": 1},
    {"order_id": "#W2378156", "item_ids": ["1151293680"]},
])
def test_argument_models_are_strict(args):
    with pytest.raises(ValidationError):
        tools.validate_args("return_delivered_order_items", args)


# --------------------------------------------------------------------------- refusals and constraints

@pytest.mark.parametrize("name, args, kind, hint", [
    ("get_order_details", {"order_id": "W2378156"}, NotFound, "Order not found"),
    ("cancel_pending_order", {"order_id": "#W2378156", "reason": "no longer needed"}, ToolError,
     "Non-pending order cannot be cancelled"),
    ("return_delivered_order_items", {"order_id": "#W2378156", "item_ids": ["1151293680", "1151293680"],
                                      "payment_method_id": "credit_card_9513926"}, NotFound, "Some item not found"),
    ("exchange_delivered_order_items", {"order_id": "#W2378156", "item_ids": ["1151293680"],
                                        "new_item_ids": ["7747408585"], "payment_method_id": "credit_card_9513926"},
     NotFound, "Variant not found"),
    ("modify_pending_order_payment", {"order_id": "#W2378156", "payment_method_id": "credit_card_9513926"},
     ToolError, "Non-pending order cannot be modified"),
    ("calculate", {"expression": "__import__('os')"}, ToolError, "Invalid characters in expression"),
    ("calculate", {"expression": "9**9**9**9"}, ToolError, None),
])
async def test_refusals_change_nothing(shared, name, args, kind, hint):
    with pytest.raises(kind) as caught:
        async with shared.transaction():
            await tools.call(shared, name, args)
    assert hint is None or caught.value.hint == hint
    assert find_leaks(caught.value.hint) == []
    assert canonical_hash(await export_state(shared)) == EXPECTED["initial_hash"]


def _golden(task: str, tool: str) -> dict:
    return next(a["arguments"] for a in TASKS[task]["evaluation_criteria"]["actions"] if a["name"] == tool)


@pytest.mark.parametrize("name, task, change, error, constraint, category, hint", [
    ("cancel_pending_order", "30", {"reason": "No longer needed"}, psycopg.errors.CheckViolation,
     "orders_cancel_reason_valid", "business_rule", "Invalid reason"),
    ("exchange_delivered_order_items", "6", {"payment_method_id": "gift_card_0000000"},
     psycopg.errors.ForeignKeyViolation, "orders_exchange_payment_method_owned", "not_found",
     "Payment method not found"),
])
async def test_the_refusals_the_schema_makes_change_nothing_and_read_as_tau2s(shared, name, task, change, error,
                                                                               constraint, category, hint):
    from agentlab.core.errors import translate
    from agentlab.domains.retail import DOMAIN

    args = {**_golden(task, name), **change}
    with pytest.raises(error) as caught:
        async with shared.transaction():
            await tools.call(shared, name, args)
    assert caught.value.diag.constraint_name == constraint
    told = translate(caught.value, hints=DOMAIN.error_hints)
    assert (told.category.value, told.reason) == (category, hint)
    assert canonical_hash(await export_state(shared)) == EXPECTED["initial_hash"]
    async with shared.transaction(force_rollback=True):  # the golden action itself is accepted
        await tools.call(shared, name, _golden(task, name))


@pytest.mark.parametrize("expression", ["2 + 2", "(1.5 + 2) * 3 / 7", "10 / 4", "7 // 2", "-3 - -2", "2 ** 10",
                                        "0.1 + 0.2", "1234.5678 * 3"])
async def test_calculate_is_pythons_arithmetic(expression):
    assert await tools.calculate(None, {"expression": expression}, None) == str(round(float(eval(expression)), 2))


@pytest.mark.parametrize("statement", [
    "UPDATE retail.payment_methods SET balance_cents = -1 WHERE source = 'gift_card'",
    "UPDATE retail.orders SET status = 'shipped'",
    "UPDATE retail.orders SET cancel_reason = 'changed my mind', status = 'cancelled'",
    "UPDATE retail.orders SET cancel_reason = 'no longer needed' WHERE status = 'pending'",
    "UPDATE retail.payment_history SET payment_method_id = (SELECT payment_method_id FROM retail.payment_methods "
    "WHERE user_id <> payment_history.user_id LIMIT 1)",
    "UPDATE retail.order_items SET item_id = (SELECT item_id FROM retail.variants "
    "WHERE product_id <> order_items.product_id LIMIT 1)",
    "UPDATE retail.users SET email = upper(email) WHERE position = 1; "
    "UPDATE retail.users SET email = (SELECT lower(email) FROM retail.users WHERE position = 1) WHERE position = 2",
    "UPDATE retail.payment_methods SET brand = 'visa' WHERE source = 'paypal'",
    "UPDATE retail.variants SET options = '{\"size\": 9}'",
])
async def test_the_schema_refuses_broken_rows(shared, statement):
    with pytest.raises(psycopg.errors.IntegrityError):
        async with shared.transaction():
            await shared.execute(statement)


# --------------------------------------------------------------------------- check-then-act under concurrency

async def test_two_concurrent_cancels_refund_the_gift_card_once(database_url):
    first = await connect_loaded(database_url)
    second = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        cur = await first.execute(
            "SELECT o.order_id, pm.payment_method_id, pm.balance_cents, ph.amount_cents FROM retail.orders o "
            "JOIN retail.payment_history ph USING (order_id) JOIN retail.payment_methods pm "
            "ON pm.payment_method_id = ph.payment_method_id WHERE o.status = 'pending' AND pm.source = 'gift_card' "
            "AND (SELECT count(*) FROM retail.payment_history x WHERE x.order_id = o.order_id) = 1 "
            "ORDER BY o.position LIMIT 1")
        order_id, gift_card, balance, amount = await cur.fetchone()
        args = {"order_id": order_id, "reason": "no longer needed"}
        async with first.transaction():
            await tools.call(first, "cancel_pending_order", args)

            async def cancel_again():
                async with second.transaction():
                    return await tools.call(second, "cancel_pending_order", args)

            racer = asyncio.create_task(cancel_again())
            for _ in range(100):  # until the second call waits on the order's row lock
                waiting = await scalar(first, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s "
                                              "AND wait_event_type = 'Lock'", (second.info.backend_pid,))
                if waiting:
                    break
                await asyncio.sleep(0.02)
            assert waiting == 1 and not racer.done()
        with pytest.raises(ToolError, match="Non-pending order cannot be cancelled"):
            await racer
        assert await scalar(first, "SELECT balance_cents FROM retail.payment_methods WHERE payment_method_id = %s",
                            (gift_card,)) == balance + amount
        assert await scalar(first, "SELECT count(*) FROM retail.payment_history WHERE order_id = %s "
                                   "AND transaction_type = 'refund'", (order_id,)) == 1
    finally:
        await second.close()
        await first.close()


async def test_tool_results_are_json(shared):
    for name, args in [("get_user_details", {"user_id": "yusuf_rossi_9620"}),
                       ("get_product_details", {"product_id": "1656367028"}),
                       ("get_item_details", {"item_id": "1151293680"}),
                       ("list_all_product_types", {}),
                       ("find_user_id_by_email", {"email": "YUSUF.ROSSI7301@EXAMPLE.COM"})]:
        result = await tools.call(shared, name, args)
        json.dumps(result)
    assert json.loads(await tools.call(shared, "list_all_product_types", {}))["T-Shirt"] == "9523456873"


@pytest.mark.parametrize("email, user_id", [
    ("yusuf.rossi7301@example.com", "yusuf_rossi_9620"),
    ("Yusuf.Rossi7301@Example.COM", "yusuf_rossi_9620"),
])
async def test_find_user_id_by_email_folds_case_as_python(shared, email, user_id):
    assert await tools.call(shared, "find_user_id_by_email", {"email": email}) == user_id


async def test_find_user_id_by_email_non_ascii_is_pythons_lower(shared):
    # KELVIN SIGN lowers to an ASCII "k" in Python (tau2), not in PostgreSQL's C-locale lower()
    cur = await shared.execute("SELECT user_id, email FROM retail.users WHERE email LIKE '%%k%%' ORDER BY position LIMIT 1")
    user_id, email = await cur.fetchone()
    kelvin = email.replace("k", "\u212a", 1)
    assert kelvin.lower() == email and not kelvin.isascii()
    assert await tools.call(shared, "find_user_id_by_email", {"email": kelvin}) == user_id
    with pytest.raises(NotFound):
        await tools.call(shared, "find_user_id_by_email", {"email": "yusuf.rossi7301@ex\u00e4mple.com"})


async def test_an_exchange_of_no_items_stores_tau2s_int_zero(shared):
    # tau2 sums the differences from the int 0; with no items it stores 0, not 0.0 (its hash sees "0")
    order_id = await scalar(shared, "SELECT order_id FROM retail.orders WHERE status = 'delivered' ORDER BY position")
    pm = await scalar(shared, "SELECT ph.payment_method_id FROM retail.payment_history ph WHERE order_id = %s", (order_id,))
    order = await tools.call(shared, "exchange_delivered_order_items", {
        "order_id": order_id, "item_ids": [], "new_item_ids": [], "payment_method_id": pm})
    assert order["status"] == "exchange requested" and order["exchange_items"] == []
    assert type(order["exchange_price_difference"]) is int and order["exchange_price_difference"] == 0
